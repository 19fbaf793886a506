"""``bandcore train``: train a small policy with GRPO/BandPO, ``--compare`` three methods, or ``--sweep`` regimes.

The options of the run's settings are generated from the fields of
:class:`experiments.toy.config.TrainConfig` (name ``--field-name``, type, default, help and choices all come
from the dataclass); only the options that are not settings of a run are written here.  Every setting is
validated (:meth:`TrainConfig.validate`) before any work.

Run directories are protected: ``--resume`` continues ``OUT/checkpoint.pt`` and refuses when there is none;
a new run into a directory that already holds one refuses; ``--new-run`` allows the new run to overwrite it.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``train`` parser, its options generated from ``TrainConfig``, and its handler."""
    from .config import TrainConfig

    p = subparsers.add_parser(
        "train", help="train a small policy with GRPO/BandPO, --compare clip / clip-higher / band-kl, or --sweep",
        description=__doc__.split("\n\n")[0].replace("``", ""), allow_abbrev=False,
    )
    p.add_argument("--out", required=True, help="output directory (metrics.jsonl, checkpoint.pt, plots)")
    p.add_argument("--compare", action="store_true", help="train clip, clip-higher and band-kl over several seeds")
    p.add_argument("--sweep", action="store_true",
                   help="the mechanism map: clip against Band variants over a grid of regimes (rarity of the "
                        "rewarded answer, dominance of the habit); writes sweep.json, sweep.md, mechanism.png")
    p.add_argument("--quick", action="store_true", help="with --compare: the small budget (a few minutes on CPU)")
    p.add_argument("--seeds", type=int, help="with --compare: number of seeds (default 10); with --sweep: seeds "
                                             "per cell (default 3)")
    p.add_argument("--resume", action="store_true",
                   help="continue from OUT/checkpoint.pt (refused when there is none, unless --new-run)")
    p.add_argument("--new-run", action="store_true", dest="new_run",
                   help="start a new run even if OUT already holds one, overwriting its files")
    p.add_argument("--max-steps", type=int, dest="max_steps", help="stop after this step (resume later)")
    p.add_argument("--no-progress", action="store_true", dest="no_progress", help="no progress bar")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: fastest for tiny models)")
    add_config_options(p, TrainConfig)
    p.set_defaults(handler=_handle)


def add_config_options(parser: argparse.ArgumentParser, config_class: type) -> None:
    """One option per dataclass field: ``--name-with-dashes``, typed, with the field's help, group and choices.

    Options default to "not given" (``argparse.SUPPRESS``), so only what the user typed overrides the defaults
    (``--compare`` overrides its budget with them).  A field that accepts ``None`` takes the word ``none``.
    """
    from .config import FIELD_TYPES

    groups: dict[str, argparse._ArgumentGroup] = {}
    for field in dataclasses.fields(config_class):
        meta = field.metadata
        group_name = meta.get("group", "settings")
        if group_name not in groups:
            groups[group_name] = parser.add_argument_group(group_name)
        kind, nullable = FIELD_TYPES[field.name]
        flag = "--" + field.name.replace("_", "-")
        text = f"{meta.get('help', field.name)} (default: {field.default})".replace("%", "%%")
        common: dict[str, Any] = {"dest": field.name, "default": argparse.SUPPRESS, "help": text}
        if kind is bool:
            groups[group_name].add_argument(flag, action=argparse.BooleanOptionalAction, **common)
            continue
        if meta.get("choices"):
            common["choices"] = list(meta["choices"])
        groups[group_name].add_argument(flag, type=_converter(kind, nullable), metavar=_metavar(field, kind),
                                        **common)


def _converter(kind: type, nullable: bool):
    def convert(text: str) -> Any:
        if nullable and text.strip().lower() == "none":
            return None
        return kind(text)

    convert.__name__ = kind.__name__  # argparse: "invalid int value: 'x'"
    return convert


def _metavar(field: dataclasses.Field, kind: type) -> str | None:
    if field.metadata.get("choices"):
        return None  # argparse lists the choices
    return {int: "N", float: "X", str: "TEXT"}.get(kind, None)


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line (the options left at their defaults are absent)."""
    from .config import TrainConfig

    return {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if hasattr(args, f.name)}


def _positive(name: str, value: Any) -> None:
    if value is not None and value < 1:
        raise ValueError(f"{name}: must be a positive integer, got {value!r}")


def _handle(args: argparse.Namespace) -> int:
    _positive("threads", args.threads)
    _positive("max_steps", args.max_steps)
    _positive("seeds", args.seeds)
    if args.compare and args.sweep:
        raise ValueError("sweep: --sweep and --compare are two different experiments; give one")
    if (args.compare or args.sweep) and args.max_steps is not None:
        raise ValueError(f"max_steps: --max-steps does not apply to --{'sweep' if args.sweep else 'compare'} "
                         "(use --steps)")
    if args.compare:
        return _compare(args)
    if args.sweep:
        if args.quick:
            raise ValueError("quick: --quick only applies to --compare")
        return _sweep(args)
    if args.quick:
        raise ValueError("quick: --quick only applies to --compare")
    if args.seeds is not None:
        raise ValueError("seeds: --seeds only applies to --compare or --sweep")
    from .config import TrainConfig
    from .train import METRICS_FILE, run

    config = TrainConfig(**_given(args))  # every setting checked here, before any work
    lines = run(config, args.out, resume=args.resume, new_run=args.new_run, max_steps=args.max_steps,
                progress=not args.no_progress, threads=args.threads)
    if lines and "eval_reward" in lines[-1]:
        last = lines[-1]
        print(f"final: reward {last['eval_reward']:.3f}, accuracy {last['eval_accuracy']:.3f}, "
              f"pass@{config.eval_k} {last['eval_pass_at_k']:.3f}, entropy {last['eval_entropy']:.3f}")
    print(f"metrics: {Path(args.out) / METRICS_FILE}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from .compare import compare

    summary = compare(args.out, overrides=_given(args), seeds=args.seeds, quick=args.quick, resume=args.resume,
                      new_run=args.new_run, progress=not args.no_progress, threads=args.threads)
    print((Path(args.out) / "summary.md").read_text(), end="")
    print(f"summary: {Path(args.out) / 'summary.json'}, {Path(args.out) / 'summary.md'} "
          f"({summary['wall_time_s']:.0f} s)")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from .sweep import SEEDS, sweep

    result = sweep(args.out, overrides=_given(args), seeds=SEEDS if args.seeds is None else args.seeds,
                   resume=args.resume, new_run=args.new_run, progress=not args.no_progress, threads=args.threads)
    print((Path(args.out) / "sweep.md").read_text(), end="")
    print(f"sweep: {Path(args.out) / 'sweep.json'}, {Path(args.out) / 'mechanism.png'} ({result['wall_time_s']:.0f} s)")
    return 0
