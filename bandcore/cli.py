"""The ``bandcore`` command.

Each stage keeps its sub-commands beside its code: a module listed here defines ``register_cli(subparsers)``.
Only the module of the command being run is imported, so ``bandcore list`` does not pay for CVXPY or torch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import import_module

# command -> (module that registers it, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("bandcore.derive", "list the catalogue of divergences"),
    "derive": ("bandcore.derive", "derive the Band of a divergence (name or formula in u)"),
    "derivations": ("bandcore.derive", "regenerate (or --check) the reports in derivations/"),
    "train": ("bandcore.rl.train", "train a small policy with GRPO/BandPO, or --compare the clipping methods"),
    "bench": ("bandcore.bench", "time the backends and tables against the published solver and a copy"),
    "bounds": ("bandcore.band", "print the Band [lower, upper] of some probabilities next to PPO's clip"),
    "table": ("bandcore.table_cli", "build, inspect, check and regenerate lookup tables"),
    "verify": ("bandcore.verify", "check the Band against CVXPY's global optimum over the simplex"),
    "plot": ("bandcore.plot", "draw the Band: bounds vs p, ratio bounds, clipped PPO regions"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; ``command``'s module registers its real sub-parsers, the others are listed by name."""
    parser = argparse.ArgumentParser(
        prog="bandcore", description="Derive, verify, compute and train with the Band (BandPO trust region)."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    if command in COMMANDS:
        import_module(COMMANDS[command][0]).register_cli(sub)
    for name, (_, help_text) in COMMANDS.items():
        if name not in sub.choices:
            sub.add_parser(name, help=help_text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (ValueError, TypeError, OSError) as err:
        print(f"bandcore {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
