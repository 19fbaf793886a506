"""``bandcore train``: registered from the checkout's :mod:`experiments.toy.cli` (see :mod:`bandcore.cli.checkout`)."""

from __future__ import annotations

import argparse

from .checkout import register_from_checkout

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``train`` parser from the source checkout, or one that says where the command is."""
    register_from_checkout("train", subparsers)
