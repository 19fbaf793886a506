"""``bandcore bench`` and ``bandcore train``: commands that run from a source checkout, not from the wheel.

The benchmark (top-level package ``benchmarks``) and the toy RL experiment (``experiments.toy``) are not library
code, so the wheel does not ship them.  In a checkout (an editable install, or ``python -m benchmarks`` /
``python -m experiments.toy`` from its root) these commands register the package's own parser; from the wheel
they register a parser that explains where the command went.
"""

from __future__ import annotations

import argparse
import sys
from importlib import import_module
from pathlib import Path
from types import ModuleType

__all__ = ["CHECKOUT_COMMANDS", "register_from_checkout"]

#: command -> (module that defines ``register(subparsers)``, what a user of the wheel runs instead)
CHECKOUT_COMMANDS = {
    "bench": ("benchmarks.cli", "python -m benchmarks"),
    "train": ("experiments.toy.cli", "python -m experiments.toy"),
}


def _checkout_module(name: str) -> ModuleType | None:
    """``name`` imported from the path, else from the checkout that holds this ``bandcore`` (editable installs)."""
    try:
        return import_module(name)
    except ModuleNotFoundError as err:
        if err.name is None or not name.startswith(err.name):
            raise  # the package exists and one of its own imports failed: say that, not "not in the wheel"
    root = Path(__file__).resolve().parents[2]
    if not (root / name.split(".")[0] / "__init__.py").is_file():
        return None
    sys.path.insert(0, str(root))
    return import_module(name)


def register_from_checkout(command: str, subparsers: argparse._SubParsersAction) -> None:
    """Add ``command``: the checkout's own parser, or one that says where the command is."""
    module_name, instead = CHECKOUT_COMMANDS[command]
    module = _checkout_module(module_name)
    if module is not None:
        module.register(subparsers)
        return
    p = subparsers.add_parser(command, help=f"(source checkout only) {instead}", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)

    def absent(args: argparse.Namespace) -> int:
        print(f"bandcore {command}: this command runs from a source checkout of bandcore, not from the installed "
              f"package; in a checkout run: {instead} (or pip install -e . there)", file=sys.stderr)
        return 2

    p.set_defaults(handler=absent)

