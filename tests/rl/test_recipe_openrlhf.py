"""examples/recipes/openrlhf_bandpo.sh, checked as far as a CPU allows: its flags go through bandcore's launcher
into OpenRLHF 0.11.2's own ``train_ppo_ray`` (its parser and its own checks), the launcher's check of the Band
against them passes, and the loss the actor's module then builds is the Band at BandPO's published settings with
OpenRLHF's flags reaching it.  No Ray cluster and no GPU: ``ray.init`` records its ``runtime_env`` and the run
stops where ``train_ppo_ray`` asks for its DeepSpeed strategy. """

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from openrlhf_host import openrlhf_installed, subprocess_env

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "examples" / "recipes" / "openrlhf_bandpo.sh"

needs_openrlhf = pytest.mark.skipif(not openrlhf_installed(), reason="OpenRLHF 0.11.2 is not installed")

DRIVER = r"""
import importlib, json, sys
import openrlhf.utils, ray
from bandcore.rl import openrlhf_launch as launch

seen = {}
ray.init = lambda *args, **kwargs: seen.update(runtime_env=kwargs.get("runtime_env"))  # no cluster

def stop_before_the_gpus(args):  # train_ppo_ray's get_strategy, called after the launcher checked args
    actor = importlib.import_module(launch.ACTOR_MODULE)
    loss = actor.PolicyLoss(**launch.policy_loss_kwargs(args))
    s = loss.band_settings
    env = seen["runtime_env"]
    print("RESULT " + json.dumps({
        "class": type(loss).__mro__[1].__qualname__, "divergence": s.divergence, "delta": list(s.radii),
        "max_ratio": s.max_ratio, "dual_clip": loss.dual_clip, "token_level_loss": loss.token_level_loss,
        "estimator": args.algo.advantage.estimator, "samples": args.rollout.n_samples_per_prompt,
        "steps_per_rollout": args.rollout.batch_size * args.rollout.n_samples_per_prompt // args.train.batch_size,
        "hook": env["worker_process_setup_hook"], "band_env": json.loads(env["env_vars"][launch.ENV_VAR]),
        "model": args.actor.model_name_or_path}), flush=True)
    raise SystemExit(0)

openrlhf.utils.get_strategy = stop_before_the_gpus
launch.main(sys.argv[1:])
"""


def recipe_flags(**env: str) -> list[str]:
    """The arguments the recipe passes to the launcher (after ``-m bandcore.rl.openrlhf_launch``, before "$@"),
    with ``${NAME}`` / ``${NAME:-default}`` filled from ``env`` or the default."""
    text = RECIPE.read_text()
    block = text.split("-m bandcore.rl.openrlhf_launch", 1)[1].split('"$@"', 1)[0]

    def value(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        return env[name] if name in env else default

    flags: list[str] = []
    for line in block.splitlines():
        line = line.strip().rstrip("\\").strip()
        if line:
            flags += re.sub(r'"?\$\{([A-Z_]+)(?::-([^}]*))?\}"?', value, line).split()
    return flags


def _run(*extra: str) -> subprocess.CompletedProcess:
    flags = recipe_flags(MODEL_PATH="/models/tiny", PROMPTS="/data/prompts.jsonl", REWARD="/rewards/math.py")
    env = subprocess_env(RAY_USAGE_STATS_ENABLED="0")
    return subprocess.run([sys.executable, "-c", DRIVER, *flags, *extra], env=env, capture_output=True, text=True,
                          timeout=600)


def test_recipe_carries_bandpos_settings_and_is_valid_bash():
    flags = recipe_flags(MODEL_PATH="m", PROMPTS="p", REWARD="r")
    pairs = dict(itertools.pairwise(flags))
    assert (pairs["--actor.band_divergence"], pairs["--actor.band_delta"], pairs["--actor.band_max_ratio"],
            pairs["--actor.dual_clip"], pairs["--actor.loss_agg_mode"]) == ("kl", "0.05", "10", "10",
                                                                            "seq-mean-token-mean")
    assert RECIPE.stat().st_mode & 0o111, "the recipe is executable"
    completed = subprocess.run(["bash", "-n", str(RECIPE)], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr


@needs_openrlhf
def test_recipe_parses_in_train_ppo_ray_and_builds_the_band():
    completed = _run()
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    assert completed.returncode == 0 and len(lines) == 1, completed.stdout[-3000:] + completed.stderr[-3000:]
    result = json.loads(lines[0][len("RESULT "):])
    assert result == {
        "class": "BandPolicyLoss", "divergence": "kl", "delta": [0.05, 0.05], "max_ratio": 10.0, "dual_clip": 10.0,
        "token_level_loss": False, "estimator": "group_norm", "samples": 8, "steps_per_rollout": 4,
        "hook": "bandcore.rl.openrlhf_launch.install_from_environment",
        "band_env": {"band_divergence": "kl", "band_delta": 0.05, "band_max_ratio": 10.0}, "model": "/models/tiny",
    }


@needs_openrlhf
def test_recipe_overrides_reach_the_loss_and_bad_ones_are_refused_naming_the_flag():
    completed = _run("--actor.band_divergence", "js", "--actor.band_delta", "0.1")
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert '"divergence": "js", "delta": [0.1, 0.1]' in completed.stdout
    completed = _run("--actor.band_delta", "-1")
    assert completed.returncode == 2 and "--actor.band_delta" in completed.stderr, completed.stderr[-3000:]
