"""``python -m experiments.toy [options]``: the same as ``bandcore train [options]`` from a checkout."""

import sys

from bandcore.cli import main

raise SystemExit(main(["train", *sys.argv[1:]]))
