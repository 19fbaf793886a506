r"""Run OpenRLHF's ``train_ppo_ray`` with the Band's policy loss in every Ray worker, without editing OpenRLHF::

    python -m bandcore.rl.openrlhf_launch --actor.band_divergence kl --actor.band_delta 0.05 \
        <every train_ppo_ray flag, as for python -m openrlhf.cli.train_ppo_ray>

OpenRLHF's Ray actor (``openrlhf/trainer/ray/ppo_actor.py``) builds its loss as ``PolicyLoss(...)`` with the name it
imported from ``openrlhf.models``; there is no registry.  The launcher

1. takes the ``--actor.band_<field>`` flags (:func:`band_parser`: the fields of
   :class:`bandcore.rl.settings.BandSettings`, ``--actor.band_gate`` and ``--actor.band_allow_on_policy``) out of
   the command line and checks them (errors name the flag); every other flag goes to ``train_ppo_ray`` untouched;
2. puts them, as JSON, in the environment variable :data:`ENV_VAR` and installs them in this process
   (:func:`install`): a post-import hook (``wrapt``) sets ``ppo_actor.PolicyLoss`` to a subclass of
   :class:`bandcore.rl.openrlhf.BandPolicyLoss` with those settings as defaults, when (or if already) the actor
   module is imported;
3. adds to the ``runtime_env`` of the ``ray.init`` that ``train_ppo_ray`` calls the environment variable and the
   worker setup hook :func:`install_from_environment` (:data:`SETUP_HOOK`), which Ray runs at the start of every
   worker process: each worker installs the same hook, and the actor's module, imported when Ray creates the
   actor, builds the Band's loss.  Processes that never import the actor module (vLLM engines, the reference and
   reward models) import nothing more;
4. checks, right after ``train_ppo_ray`` parsed its flags and before any actor exists, the Band against them
   (:func:`check_train_args`: the loss built as the actor will build it, the on-policy rule, the rollout
   log-probabilities the rollout anchor and the gate need), and then runs ``train_ppo_ray``'s main unchanged.

Ray must not be running in the launcher's process before it starts (the ``ray.init`` of ``train_ppo_ray`` carries
the hook); with ``ray job submit`` Ray merges this ``runtime_env`` with the job's.  ``-h`` prints the Band's flags,
then ``train_ppo_ray``'s.  This module imports neither torch nor OpenRLHF until it runs (Ray imports it in every
worker).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import runpy
import sys
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from .settings import BandSettings, check_divergence

__all__ = ["ACTOR_MODULE", "ENV_VAR", "FLAG_PREFIX", "SETUP_HOOK", "TRAIN_MODULE", "band_flags", "band_parser",
           "check_train_args", "install", "install_from_environment", "main", "parse_band_flags",
           "policy_loss_kwargs", "ratio_is_always_one", "runtime_env_with_band"]

ENV_VAR = "BANDCORE_OPENRLHF_BAND"
ACTOR_MODULE = "openrlhf.trainer.ray.ppo_actor"
TRAIN_MODULE = "openrlhf.cli.train_ppo_ray"
FLAG_PREFIX = "--actor.band_"
SETUP_HOOK = "bandcore.rl.openrlhf_launch.install_from_environment"
_OWN_KEYS = ("clip_eps", "clip_eps_high", "dual_clip", "key_prefix", "key_names")  # OpenRLHF's or internal
_INTEGERS = ("delta_steps", "delta_hold_steps")
_TEXT = ("divergence", "method", "loss_form", "delta_schedule", "anchor")


def _boolean(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def band_parser() -> argparse.ArgumentParser:
    """The parser of the ``--actor.band_*`` flags (no abbreviations, so no other flag is taken for one)."""
    parser = argparse.ArgumentParser(
        prog="python -m bandcore.rl.openrlhf_launch", add_help=False, allow_abbrev=False,
        description="The Band's flags; every other flag goes to openrlhf.cli.train_ppo_ray. Each --actor.band_X is "
                    "the field X of bandcore.rl.settings.BandSettings (docs/rl.md, OpenRLHF).")
    for item in fields(BandSettings):
        name = item.name
        if name in _OWN_KEYS or name == "allow_on_policy":
            continue
        kind = int if name in _INTEGERS else str if name in _TEXT else _boolean if name == "check" else float
        parser.add_argument(FLAG_PREFIX + name, type=kind, default=None, metavar=name.upper())
    parser.add_argument(FLAG_PREFIX + "gate", default=None, metavar="DIVERGENCE",
                        help="the Band of this divergence as OpenRLHF's token-level mismatch gate (radius: "
                             "--algo.advantage.is_correction_threshold)")
    parser.add_argument(FLAG_PREFIX + "allow_on_policy", action="store_true", default=None,
                        help="accept a run whose ratio is always 1 (the Band then never acts)")
    return parser


def band_flags() -> list[str]:
    """Every ``--actor.band_*`` flag."""
    return sorted(option for action in band_parser()._actions for option in action.option_strings)


def parse_band_flags(argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """``(band, rest)``: the given ``--actor.band_*`` flags as :class:`BandPolicyLoss` keywords (``band_delta``:
    value), checked (``ValueError`` / ``TypeError`` naming the flag), and every other argument in order."""
    namespace, rest = band_parser().parse_known_args(list(argv))
    given = {key: value for key, value in vars(namespace).items() if value is not None}
    flags = {FLAG_PREFIX + key[len("actor.band_"):]: value for key, value in given.items()}
    gate = flags.pop(FLAG_PREFIX + "gate", None)
    BandSettings.from_host(flags, prefix=FLAG_PREFIX)  # raises, naming --actor.band_<field>
    if gate is not None:
        check_divergence(gate, name=FLAG_PREFIX + "gate")
        flags[FLAG_PREFIX + "gate"] = gate
    leftover = [arg for arg in rest if arg.startswith(FLAG_PREFIX)]
    if leftover:
        raise ValueError(f"unknown Band flag(s) {leftover}; the Band's flags are {band_flags()}")
    return {"band_" + key[len(FLAG_PREFIX):]: value for key, value in flags.items()}, list(rest)


def _patch_actor_module(band: Mapping[str, Any], module: Any) -> None:
    from openrlhf.models.loss import PolicyLoss

    from .openrlhf import band_policy_loss_class

    current = getattr(module, "PolicyLoss", None)
    if not (isinstance(current, type) and issubclass(current, PolicyLoss)):
        raise ImportError(f"{ACTOR_MODULE}.PolicyLoss is {current!r}, not OpenRLHF's PolicyLoss: this OpenRLHF builds "
                          "its loss elsewhere, and the Band cannot replace it")
    module.PolicyLoss = band_policy_loss_class(**band)


def install(band: Mapping[str, Any]) -> None:
    """In this process: when :data:`ACTOR_MODULE` is imported (now, if it already is), its ``PolicyLoss`` becomes
    :func:`bandcore.rl.openrlhf.band_policy_loss_class` of ``band`` (``band_*`` keywords)."""
    import wrapt

    wrapt.register_post_import_hook(functools.partial(_patch_actor_module, dict(band)), ACTOR_MODULE)


def install_from_environment() -> None:
    """The Ray worker setup hook: :func:`install` with the settings in :data:`ENV_VAR` (JSON); raises if it is
    missing or not a JSON object (Ray then stops the worker with the message)."""
    text = os.environ.get(ENV_VAR)
    if text is None:
        raise RuntimeError(f"{SETUP_HOOK} is the Ray worker setup hook of bandcore.rl.openrlhf_launch, and the "
                           f"environment variable {ENV_VAR} that carries the Band's settings is not set")
    band = json.loads(text)
    if not isinstance(band, dict):
        raise ValueError(f"{ENV_VAR} must hold a JSON object of band_* settings, got {text!r:.200}")
    install(band)


def runtime_env_with_band(runtime_env: Mapping[str, Any] | None, band: Mapping[str, Any]) -> dict[str, Any]:
    """``runtime_env`` plus :data:`ENV_VAR` and the worker setup hook; ``ValueError`` if it has another hook."""
    env = dict(runtime_env or {})
    hook = env.get("worker_process_setup_hook")
    if hook is not None and hook != SETUP_HOOK:
        raise ValueError(f"runtime_env already has worker_process_setup_hook={hook!r}; the Band's launcher needs "
                         f"that hook ({SETUP_HOOK}) to install its loss in every Ray worker")
    env["worker_process_setup_hook"] = SETUP_HOOK
    env["env_vars"] = {**dict(env.get("env_vars") or {}), ENV_VAR: json.dumps(dict(band))}
    return env


def policy_loss_kwargs(args: Any) -> dict[str, Any]:
    """The arguments OpenRLHF 0.11.2's actor (``ActorPPOTrainer.__init__``) passes to ``PolicyLoss``, from
    ``train_ppo_ray``'s parsed ``args`` (a test compares them with the actor's source)."""
    return {
        "clip_eps_low": args.actor.eps_clip_low_high[0],
        "clip_eps_high": args.actor.eps_clip_low_high[1],
        "dual_clip": args.actor.dual_clip,
        "token_level_loss": args.actor.loss_agg_mode == "token-mean",
        "policy_loss_type": args.actor.policy_loss_type,
        "is_correction_level": args.algo.advantage.is_correction_level,
        "is_correction_mode": args.algo.advantage.is_correction_mode,
        "is_correction_gating": args.algo.advantage.is_correction_gating,
        "is_correction_threshold": args.algo.advantage.is_correction_threshold,
    }


def ratio_is_always_one(args: Any) -> bool:
    """True when every rollout batch is used within one optimizer step (one epoch, no more samples than one
    training batch, synchronous training), so that the ratio of the old log-probabilities, computed with the
    weights that generated the batch, is exactly 1."""
    samples = args.rollout.batch_size * args.rollout.n_samples_per_prompt
    return (args.train.max_epochs == 1 and samples <= args.train.batch_size and not args.train.async_enable
            and not args.train.dynamic_batch_enable)


def check_train_args(args: Any, band: Mapping[str, Any]) -> None:
    """The Band against ``train_ppo_ray``'s parsed ``args``: the loss built as the actor will build it (its errors
    name the flags), the rollout log-probabilities that the rollout anchor and the gate need, the on-policy rule."""
    from .openrlhf import band_policy_loss_class

    loss = band_policy_loss_class(**band)(**policy_loss_kwargs(args))
    needs = [f"{FLAG_PREFIX}{key}" for key, on in (("anchor rollout", loss.band_settings.anchor == "rollout"),
                                                  ("gate", band.get("band_gate") is not None)) if on]
    if needs and args.algo.advantage.is_correction_level == "off":
        raise ValueError(f"{' and '.join(needs)} {'need' if len(needs) > 1 else 'needs'} the rollout engine's "
                         "log-probabilities, which OpenRLHF returns only with --algo.advantage.is_correction_level "
                         "token (or seq)")
    settings = BandSettings.from_host({FLAG_PREFIX + k[len("band_"):]: v for k, v in band.items()
                                       if k != "band_gate"}, prefix=FLAG_PREFIX)
    settings.check_on_policy(
        ratio_is_always_one(args),
        f"--train.max_epochs {args.train.max_epochs}, --rollout.batch_size {args.rollout.batch_size} x "
        f"--rollout.n_samples_per_prompt {args.rollout.n_samples_per_prompt} <= --train.batch_size "
        f"{args.train.batch_size} (each rollout batch is used within one optimizer step; e.g. --train.max_epochs 2 "
        "moves it)",
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``train_ppo_ray`` with the Band (module docstring); ``argv`` defaults to ``sys.argv[1:]``."""
    try:
        band, rest = parse_band_flags(sys.argv[1:] if argv is None else argv)
    except (TypeError, ValueError) as err:
        band_parser().error(str(err))  # usage and the message, exit status 2
    if "-h" in rest or "--help" in rest:
        print(band_parser().format_help())
    import openrlhf.utils
    import ray

    if ray.is_initialized():
        raise RuntimeError("Ray is already running in this process; the launcher must start it (its runtime_env "
                           "carries the Band to every worker)")
    os.environ[ENV_VAR] = json.dumps(band)
    install(band)
    init, get_strategy = ray.init, openrlhf.utils.get_strategy

    @functools.wraps(init)
    def init_with_band(*args: Any, **kwargs: Any) -> Any:
        kwargs["runtime_env"] = runtime_env_with_band(kwargs.get("runtime_env"), band)
        return init(*args, **kwargs)

    @functools.wraps(get_strategy)
    def get_strategy_after_check(args: Any) -> Any:
        check_train_args(args, band)
        return get_strategy(args)

    ray.init, openrlhf.utils.get_strategy = init_with_band, get_strategy_after_check
    sys.argv = [TRAIN_MODULE, *rest]
    try:
        runpy.run_module(TRAIN_MODULE, run_name="__main__", alter_sys=True)
    finally:
        ray.init, openrlhf.utils.get_strategy = init, get_strategy


if __name__ == "__main__":
    main()
