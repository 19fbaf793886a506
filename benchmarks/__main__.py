"""``python -m benchmarks [options]``: the same as ``bandcore bench [options]`` from a checkout."""

import sys

from bandcore.cli import main

raise SystemExit(main(["bench", *sys.argv[1:]]))
