"""The ``bandcore`` command: one small module per sub-command in this package.

Each module ``bandcore.cli.<name>`` defines ``register(subparsers)``, which adds its parser and sets
``handler=<function(args) -> int>``.  Only the module of the command being run is imported, so ``bandcore list``
does not pay for CVXPY or torch.  Argument parsing lives here and in those modules only.

Exit codes: 0 success; 1 a failure (the check found a problem, a file is missing or broken); 2 a usage error
(a bad argument value, an unknown divergence, a missing optional dependency).  Every error is one line on
stderr naming the argument; ``--debug`` shows the Python traceback instead.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import import_module

from .._contract import BandcoreError

__all__ = ["COMMANDS", "build_parser", "main"]

# command -> one-line help; the command's parser lives in bandcore.cli.<module>
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("derive", "list the catalogue of divergences"),
    "derive": ("derive", "derive the Band of a divergence (name, alias, alpha(a) or a formula in u)"),
    "derivations": ("derive", "regenerate (or --check) the derivation reports"),
    "bounds": ("bounds", "print the Band [lower, upper] of some probabilities next to PPO's clip"),
    "verify": ("verify", "check the Band against CVXPY's global optimum over the simplex"),
    "plot": ("plot", "draw the Band: bounds vs p, ratio bounds, clipped PPO regions"),
    "table": ("table", "build, inspect, check and regenerate lookup tables"),
    "bench": ("bench", "time the backends and tables against the published solver and a copy"),
    "train": ("train", "train a small policy with GRPO/BandPO, or --compare the clipping methods"),
}


#: optional dependency -> the extra that installs it
_EXTRAS = {"torch": "torch", "transformers": "rl", "trl": "rl", "datasets": "rl", "accelerate": "rl",
           "tokenizers": "rl", "verl": "verl", "safetensors": "all"}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints the usage too)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; ``command``'s module registers its real sub-parser, the others are listed by name."""
    parser = _Parser(
        prog="bandcore", description="Derive, verify, compute and train with the Band (BandPO trust region)."
    )
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    if command in COMMANDS:
        import_module(f"{__name__}.{COMMANDS[command][0]}").register(sub)
    for name, (_, help_text) in COMMANDS.items():
        if name not in sub.choices:
            sub.add_parser(name, help=help_text)
    for name in COMMANDS:  # --debug is accepted after the command too
        _add_debug(sub.choices[name])
    return parser


def _add_debug(parser: argparse.ArgumentParser) -> None:
    if "--debug" not in parser._option_string_actions:
        parser.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    for action in parser._actions:  # nested sub-commands (bandcore table build ...)
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _add_debug(child)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``bandcore`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    debug = "--debug" in argv
    try:
        args = build_parser(command).parse_args(argv)
        args.argv = argv  # the command line as given (bench records it in its report)
        return int(args.handler(args) or 0)
    except SystemExit as done:  # argparse: --help (0) or a usage error (2), already printed
        return int(done.code or 0) if not isinstance(done.code, str) else 2
    except KeyboardInterrupt:
        print(f"bandcore {command}: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as err:
        if debug:
            raise
        name = (err.name or "").split(".")[0]
        extra = _EXTRAS.get(name, "all")
        print(f"bandcore {command}: error: {name or err} is not installed; install it with: "
              f"pip install 'bandcore[{extra}]'", file=sys.stderr)
        return 2
    except (ValueError, TypeError) as err:
        if debug:
            raise
        print(f"bandcore {command}: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except (BandcoreError, OSError) as err:
        if debug:
            raise
        print(f"bandcore {command}: error: {_one_line(err)}", file=sys.stderr)
        return 1


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 600 else text[:597] + "..."


if __name__ == "__main__":
    raise SystemExit(main())
