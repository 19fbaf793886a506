"""The OpenRLHF launcher (bandcore.rl.openrlhf_launch): its flags, the worker hook, and a real train_ppo_ray start.

The flags and the runtime_env are tested wherever bandcore is; what needs OpenRLHF runs where it is installed
(.ci/run), in fresh subprocesses that import OpenRLHF's modules as a Ray worker does, and (slow) through
OpenRLHF's own train_ppo_ray main and a real local Ray cluster, up to the point where it would ask for GPUs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
from openrlhf_host import import_plugin, openrlhf_installed, subprocess_env

from bandcore.rl import openrlhf_launch as launch

needs_openrlhf = pytest.mark.skipif(not openrlhf_installed(), reason="OpenRLHF is not installed (.ci/run installs "
                                                                     "it in an environment of its own)")


# ---------------------------------------------------------------------------------------------------------
# The flags (no OpenRLHF needed)
# ---------------------------------------------------------------------------------------------------------


def test_band_flags_are_taken_out_and_the_rest_kept_in_order():
    argv = ["--actor.model_name_or_path", "m", "--actor.band_divergence", "hellinger", "--train.max_epochs", "2",
            "--actor.band_delta_low=0.02", "--actor.band_delta_high", "0.1", "--actor.band_check", "false",
            "--actor.band_allow_on_policy", "--actor.band_gate", "tv", "--actor.eps_clip_low_high", "0.2", "0.28"]
    band, rest = launch.parse_band_flags(argv)
    assert band == {"band_divergence": "hellinger", "band_delta_low": 0.02, "band_delta_high": 0.1,
                    "band_check": False, "band_allow_on_policy": True, "band_gate": "tv"}
    assert rest == ["--actor.model_name_or_path", "m", "--train.max_epochs", "2", "--actor.eps_clip_low_high", "0.2",
                    "0.28"]
    assert launch.parse_band_flags([]) == ({}, [])


def test_every_settings_field_has_a_flag():
    from dataclasses import fields

    from bandcore.rl.settings import BandSettings

    own = {"clip_eps", "clip_eps_high", "dual_clip", "key_prefix", "key_names"}  # OpenRLHF's flags, or internal
    assert set(launch.band_flags()) == {f"--actor.band_{f.name}" for f in fields(BandSettings) if f.name not in own} \
        | {"--actor.band_gate"}


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--actor.band_delta", "-1"], "--actor.band_delta must be a finite number > 0"),
        (["--actor.band_delta", "0.05", "--actor.band_delta_low", "0.02"], "--actor.band_delta=0.05 sets both"),
        (["--actor.band_method", "ppo"], "--actor.band_method must be one of"),
        (["--actor.band_loss_form", "dppo", "--actor.band_clip_ratio_c", "0.5"], "--actor.band_clip_ratio_c"),
        (["--actor.band_delta_schedule", "linear"], "--actor.band_delta_schedule='linear' needs"),
        (["--actor.band_divergence", "nonsense(u"], "--actor.band_divergence"),
        (["--actor.band_gate", "no-such"], "--actor.band_gate"),
        (["--actor.band_dleta", "0.1"], r"unknown Band flag\(s\) \['--actor.band_dleta'\]"),
    ],
)
def test_bad_flags_are_refused_naming_the_flag(argv, match):
    with pytest.raises(ValueError, match=match):
        launch.parse_band_flags(argv)


def test_the_command_line_exits_with_the_message(capsys):
    with pytest.raises(SystemExit) as stop:
        launch.main(["--actor.band_delta", "0", "--actor.model_name_or_path", "m"])
    assert stop.value.code == 2
    assert "--actor.band_delta must be a finite number > 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        launch.main(["--actor.band_delta", "abc"])
    assert "argument --actor.band_delta: invalid float value: 'abc'" in capsys.readouterr().err


def test_runtime_env_keeps_openrlhfs_and_adds_the_hook():
    theirs = {"env_vars": {"TOKENIZERS_PARALLELISM": "true", "NCCL_DEBUG": "WARN"}}
    env = launch.runtime_env_with_band(theirs, {"band_delta": 0.05})
    assert env["worker_process_setup_hook"] == launch.SETUP_HOOK == \
        f"{launch.install_from_environment.__module__}.{launch.install_from_environment.__name__}"
    assert env["env_vars"] == {**theirs["env_vars"], launch.ENV_VAR: '{"band_delta": 0.05}'}
    assert theirs == {"env_vars": {"TOKENIZERS_PARALLELISM": "true", "NCCL_DEBUG": "WARN"}}  # not modified
    assert launch.runtime_env_with_band(None, {})["env_vars"] == {launch.ENV_VAR: "{}"}
    with pytest.raises(ValueError, match=r"already has worker_process_setup_hook='mine\.hook'"):
        launch.runtime_env_with_band({"worker_process_setup_hook": "mine.hook"}, {})


def test_the_worker_hook_needs_its_settings(monkeypatch):
    monkeypatch.delenv(launch.ENV_VAR, raising=False)
    with pytest.raises(RuntimeError, match=launch.ENV_VAR):
        launch.install_from_environment()
    monkeypatch.setenv(launch.ENV_VAR, "[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        launch.install_from_environment()


# ---------------------------------------------------------------------------------------------------------
# The check against train_ppo_ray's parsed arguments
# ---------------------------------------------------------------------------------------------------------


def _args(epochs=2, rollout=8, samples=4, train=16, level="off", threshold=(0.5, 5.0), dual_clip=None):
    """The parts of train_ppo_ray's hierarchical args that the check reads (names as train_ppo_ray's flags)."""
    return SimpleNamespace(
        actor=SimpleNamespace(eps_clip_low_high=(0.2, 0.28), dual_clip=dual_clip, loss_agg_mode="token-mean",
                              policy_loss_type="ppo"),
        algo=SimpleNamespace(advantage=SimpleNamespace(is_correction_level=level, is_correction_mode="mask",
                                                       is_correction_gating="ratio",
                                                       is_correction_threshold=list(threshold))),
        rollout=SimpleNamespace(batch_size=rollout, n_samples_per_prompt=samples),
        train=SimpleNamespace(max_epochs=epochs, batch_size=train, async_enable=False, dynamic_batch_enable=False),
    )


def test_on_policy_rule():
    assert launch.ratio_is_always_one(_args(epochs=1, rollout=4, samples=4, train=16))
    assert not launch.ratio_is_always_one(_args(epochs=2, rollout=4, samples=4, train=16))
    assert not launch.ratio_is_always_one(_args(epochs=1, rollout=8, samples=4, train=16))  # 2 steps per rollout


@needs_openrlhf
def test_check_of_the_parsed_arguments():
    import_plugin()
    launch.check_train_args(_args(), {"band_delta": 0.05})
    with pytest.raises(ValueError, match=r"--train.max_epochs 1, .* --actor.band_allow_on_policy=True"):
        launch.check_train_args(_args(epochs=1, rollout=4), {})
    launch.check_train_args(_args(epochs=1, rollout=4), {"band_allow_on_policy": True})
    with pytest.raises(ValueError, match=r"band_anchor rollout needs .*\.is_correction_level token"):
        launch.check_train_args(_args(), {"band_anchor": "rollout"})
    launch.check_train_args(_args(level="token"), {"band_anchor": "rollout"})
    with pytest.raises(ValueError, match="is_correction_threshold"):  # the gate's radius is one value
        launch.check_train_args(_args(level="token"), {"band_gate": "kl"})
    launch.check_train_args(_args(level="token", threshold=(0.0, 0.01)), {"band_gate": "kl"})
    with pytest.raises(ValueError, match=r"dual_clip=3\.0 applies to band_loss_form='clip'"):
        launch.check_train_args(_args(dual_clip=3.0), {"band_loss_form": "dppo"})


# ---------------------------------------------------------------------------------------------------------
# In a fresh process, as a Ray worker: the setup hook, then the actor's module
# ---------------------------------------------------------------------------------------------------------

WORKER = r"""
import importlib, json
from bandcore.rl.openrlhf_launch import install_from_environment
install_from_environment()  # what Ray runs first in every worker process (the runtime_env's setup hook)
actor = importlib.import_module("openrlhf.trainer.ray.ppo_actor")  # what Ray imports to create the actor
loss = actor.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=None, token_level_loss=True,
                        policy_loss_type="ppo", is_correction_level="off", is_correction_mode="mask",
                        is_correction_gating="ratio", is_correction_threshold=[0.5, 5.0])
import openrlhf.models, openrlhf.models.loss
print("RESULT " + json.dumps({
    "classes": [f"{c.__module__}.{c.__qualname__}" for c in type(loss).__mro__[:3]],
    "settings": [loss.band_settings.divergence, loss.band_settings.delta_low, loss.band_settings.delta_high],
    "openrlhf_models_untouched": openrlhf.models.PolicyLoss is openrlhf.models.loss.PolicyLoss,
}))
"""


def _result(completed: subprocess.CompletedProcess) -> dict:
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    assert completed.returncode == 0 and len(lines) == 1, completed.stdout[-3000:] + completed.stderr[-3000:]
    return json.loads(lines[0][len("RESULT "):])


@needs_openrlhf
def test_a_worker_process_builds_the_band_loss_where_the_actor_looks_it_up():
    band = {"band_divergence": "hellinger", "band_delta_low": 0.02, "band_delta_high": 0.1}
    env = subprocess_env(**{launch.ENV_VAR: json.dumps(band)})
    result = _result(subprocess.run([sys.executable, "-c", WORKER], env=env, capture_output=True, text=True,
                                    timeout=600))
    assert result == {
        "classes": ["bandcore.rl.openrlhf.BandPolicyLoss", "bandcore.rl.openrlhf.BandPolicyLoss",
                    "openrlhf.models.loss.PolicyLoss"],
        "settings": ["hellinger", 0.02, 0.1],
        "openrlhf_models_untouched": True,
    }


@needs_openrlhf
def test_help_lists_the_band_flags_then_train_ppo_rays():
    completed = subprocess.run([sys.executable, "-m", "bandcore.rl.openrlhf_launch", "-h"], env=subprocess_env(),
                               capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.index("--actor.band_divergence") < completed.stdout.index("--actor.model_name_or_path")


# ---------------------------------------------------------------------------------------------------------
# Slow: OpenRLHF's own train_ppo_ray main, a real local Ray cluster, a real Ray worker
# ---------------------------------------------------------------------------------------------------------

DRIVER = r"""
import json, os, sys
import openrlhf.utils, ray
from bandcore.rl import openrlhf_launch as launch

def in_worker(args):
    import importlib, os
    actor = importlib.import_module(launch.ACTOR_MODULE)
    loss = actor.PolicyLoss(**launch.policy_loss_kwargs(args))
    s = loss.band_settings
    return {"pid": os.getpid(), "class": type(loss).__mro__[1].__qualname__, "divergence": s.divergence,
            "delta": s.delta, "eps": [loss.clip_eps_low, loss.clip_eps_high]}

def stop_before_the_gpus(args):  # train_ppo_ray's get_strategy, called after the launcher checked args
    result = ray.get(ray.remote(num_cpus=0)(in_worker).remote(args))
    result["driver_pid"] = os.getpid()
    print("RESULT " + json.dumps(result), flush=True)
    ray.shutdown()
    raise SystemExit(0)

openrlhf.utils.get_strategy = stop_before_the_gpus
launch.main(sys.argv[1:])
"""

TRAIN_FLAGS = ["--actor.model_name_or_path", "unused", "--algo.advantage.estimator", "group_norm",
               "--rollout.n_samples_per_prompt", "4", "--reward.remote_url", "http://127.0.0.1:9/reward",
               "--actor.eps_clip_low_high", "0.2", "0.28"]


@needs_openrlhf
@pytest.mark.slow
def test_train_ppo_ray_through_the_launcher_builds_the_band_in_a_ray_worker():
    argv = ["--actor.band_divergence", "js", "--actor.band_delta", "0.07", *TRAIN_FLAGS, "--train.max_epochs", "2"]
    env = subprocess_env(RAY_USAGE_STATS_ENABLED="0")
    result = _result(subprocess.run([sys.executable, "-c", DRIVER, *argv], env=env, capture_output=True, text=True,
                                    timeout=600))
    assert result["pid"] != result["driver_pid"]  # built in a Ray worker process
    assert (result["class"], result["divergence"], result["delta"]) == ("BandPolicyLoss", "js", 0.07)
    assert result["eps"] == [0.2, 0.28]  # OpenRLHF's own flags reach the loss


@needs_openrlhf
@pytest.mark.slow
def test_train_ppo_ray_through_the_launcher_refuses_an_on_policy_run_before_any_actor():
    argv = ["--actor.band_delta", "0.05", *TRAIN_FLAGS, "--rollout.batch_size", "4", "--train.batch_size", "16"]
    env = subprocess_env(RAY_USAGE_STATS_ENABLED="0")
    completed = subprocess.run([sys.executable, "-c", DRIVER, *argv], env=env, capture_output=True, text=True,
                               timeout=600)
    assert completed.returncode != 0 and "RESULT" not in completed.stdout
    assert "the ratio is always 1 with --train.max_epochs 1" in completed.stderr, completed.stderr[-3000:]
