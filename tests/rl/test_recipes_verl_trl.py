"""The recipes a user copies (examples/recipes/): verl's Hydra config and launch script, the TRL script.

verl needs GPUs, so it is checked as far as a CPU allows: the recipe composes with verl's own ppo_trainer config
(Hydra's compose API, every override a real verl key), verl's own ``main_ppo`` parses the launch script's
arguments (``--cfg job``: the composed config, no training), and the loss resolves in a fresh process.  The TRL
recipe runs to its first optimizer steps on a tiny local model.  scripts/gpu_check_recipes.py runs the verl recipe
on a GPU.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tiers import sampled

verl = pytest.importorskip("verl")
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "examples" / "recipes"
VERL_CONFIG = Path(verl.__file__).parent / "trainer" / "config"
#: BandPO's published settings, as the recipes must carry them
PUBLISHED = {"band_divergence": "kl", "band_delta": 0.05, "band_max_ratio": 10.0, "clip_ratio_c": 10.0,
             "loss_agg_mode": "seq-mean-token-mean"}  # fmt: skip


def _env() -> dict[str, str]:
    """This interpreter first on PATH (the scripts call python3 / python) and this checkout importable."""
    return {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}  # fmt: skip


def _substitute(text: str) -> str:
    """``"${NAME:-default}"`` -> default (a placeholder path where there is none), quotes dropped."""
    def value(match: re.Match) -> str:
        return match.group(2) if match.group(2) is not None else f"/placeholder/{match.group(1).lower()}"

    return re.sub(r'"?\$\{([A-Z_]+)(?::-([^}]*))?\}"?', value, text).replace("'", "")


def single_node_overrides() -> list[str]:
    """The hydra overrides of examples/recipes/verl_bandpo.sh (after --config-name, before "$@")."""
    text = (RECIPES / "verl_bandpo.sh").read_text()
    block = text.split("--config-name=verl_bandpo", 1)[1].split('"$@"', 1)[0]
    return [_substitute(line.strip().rstrip("\\").strip()) for line in block.splitlines() if line.strip(" \\")]


def multi_node_overrides() -> list[str]:
    text = (ROOT / "examples" / "verl_bandpo.sh").read_text()
    block = re.search(r"^OVERRIDES=\(\n(.*?)^\)", text, re.S | re.M).group(1)
    return [_substitute(line.strip()) for line in block.splitlines() if line.strip()]


def _check_keys_are_verls(overrides: list[str]) -> None:
    flat = OmegaConf.load(VERL_CONFIG / "_generated_ppo_trainer.yaml")  # verl's config, flattened
    for override in overrides:
        key = override.split("=", 1)[0]
        parent_key, _, leaf = key.lstrip("+").rpartition(".")
        parent = OmegaConf.select(flat, parent_key)
        assert parent is not None and leaf in list(parent.keys()), key


def _check_published(cfg) -> None:
    from verl.utils.config import omega_conf_to_dataclass

    from bandcore.rl.verl import BandPolicyLossConfig

    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    loss = actor.policy_loss
    assert isinstance(loss, BandPolicyLossConfig) and loss.loss_mode == "bandpo"
    got = {"band_divergence": loss.band_divergence, "band_delta": loss.band_delta,
           "band_max_ratio": loss.band_max_ratio, "clip_ratio_c": actor.clip_ratio_c,
           "loss_agg_mode": actor.loss_agg_mode}  # fmt: skip
    assert got == PUBLISHED
    assert cfg.algorithm.rollout_correction.bypass_mode is False and cfg.algorithm.adv_estimator == "grpo"
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES == "bandcore.rl.verl"


@pytest.mark.parametrize("overrides", [single_node_overrides, multi_node_overrides], ids=["single", "multi"])
def test_verl_recipe_composes_with_verls_config(overrides):
    overrides = overrides()
    assert overrides and not any(".policy_loss." in o for o in overrides)  # the Band's settings: the recipe's
    _check_keys_are_verls(overrides)
    with initialize_config_dir(config_dir=str(RECIPES), version_base=None):
        cfg = compose(config_name="verl_bandpo", overrides=overrides)
    _check_published(cfg)
    assert cfg.actor_rollout_ref.model.path in ("/placeholder/model_path", "")  # the scripts' ${MODEL_PATH}


def test_verl_recipe_settings_can_be_overridden():
    with initialize_config_dir(config_dir=str(RECIPES), version_base=None):
        cfg = compose(config_name="verl_bandpo", overrides=["actor_rollout_ref.actor.policy_loss.band_delta=0.1"])
    assert cfg.actor_rollout_ref.actor.policy_loss.band_delta == 0.1


def test_verl_launch_script_arguments_parse():
    """verl's main_ppo parses the launch script's command line (hydra's --cfg job prints the composed config and
    stops before any training)."""
    env = {**_env(), "MODEL_PATH": "/models/tiny", "TRAIN_FILES": "/data/train.parquet",
           "VAL_FILES": "/data/val.parquet"}  # fmt: skip
    done = subprocess.run(["bash", str(RECIPES / "verl_bandpo.sh"), "trainer.total_epochs=2", "--cfg", "job"],
                          capture_output=True, text=True, env=env, timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    cfg = OmegaConf.create(done.stdout)
    assert cfg.actor_rollout_ref.model.path == "/models/tiny" and cfg.trainer.total_epochs == 2
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "bandpo"
    _check_published(cfg)


def test_verl_launch_script_refuses_missing_paths():
    env = {k: v for k, v in _env().items() if k not in ("MODEL_PATH", "TRAIN_FILES", "VAL_FILES")}
    done = subprocess.run(["bash", str(RECIPES / "verl_bandpo.sh")], capture_output=True, text=True, env=env,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode != 0 and "MODEL_PATH" in done.stderr


@pytest.mark.parametrize("route", sampled(["external_modules", "recipe_target"], fast=["recipe_target"]))
def test_bandpo_resolves_in_a_fresh_process(route):
    """What a fresh Ray worker does: the recipe's VERL_USE_EXTERNAL_MODULES, or building the recipe's policy-loss
    config (its _target_), registers "bandpo" in verl's registry."""
    code = {
        "external_modules": "",
        "recipe_target": (f"from omegaconf import OmegaConf; from verl.utils.config import omega_conf_to_dataclass; "
                          f"omega_conf_to_dataclass(OmegaConf.load({str(RECIPES / 'verl_bandpo.yaml')!r})"
                          f".actor_rollout_ref.actor.policy_loss); "),
    }[route] + ("from verl.trainer.ppo.core_algos import get_policy_loss_fn; "
                "print(get_policy_loss_fn('bandpo').__module__)")  # fmt: skip
    env = _env()
    if route == "external_modules":
        env["VERL_USE_EXTERNAL_MODULES"] = "bandcore.rl.verl"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "bandcore.rl.verl"


@pytest.mark.slow
def test_trl_recipe_runs_its_first_optimizer_steps(tmp_path):
    """examples/recipes/trl_bandpo.sh: examples/trl_grpo.py at BandPO's settings, two GRPO steps on the CPU."""
    pytest.importorskip("trl")
    env = {**_env(), "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(RECIPES / "trl_bandpo.sh"), "--out", str(tmp_path), "--max-steps", "2",
                           "--warmup-steps", "0"], capture_output=True, text=True, env=env, timeout=900,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "BandPO: kl delta=0.05 max_ratio=10.0 dual clip (TRL delta)=10.0 loss_type=grpo" in done.stdout
    log = json.loads((tmp_path / "log.json").read_text())
    assert len(log) == 2 and all("loss" in entry for entry in log)
