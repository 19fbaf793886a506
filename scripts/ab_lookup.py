"""Interleaved A/B timing of the Numba table lookup of two bandcore source trees, in ns per token (both bounds).

    git -C /work/main archive HEAD bandcore | tar -x -C /tmp/lookup_before
    python scripts/ab_lookup.py /tmp/lookup_before . --reps 5 --threads 1 2 --sizes 500000 10000

Each tree runs in its own worker process (its own ``BANDCORE_CACHE``, so generated modules never mix); the
driver asks both for the same measurement in alternating order, rep after rep, and prints medians.  A
measurement is the median of several ``BandTable.shipped(name, 0.05).log(x, backend="numba")`` calls on ``n``
float32 tokens of :func:`bandcore.tools.bench_inputs.log_probs` (``llm`` and ``mid``, seed 0), on
``numba.set_num_threads(threads)`` threads; rep 0 (compilation) is not counted.  ``--copy`` adds a roofline
row: one Numba pass reading the float32 input and writing two float32 outputs.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

from ab_workers import interleaved, start_workers

TABLES = ["kl", "js", "reverse_kl", "hellinger", "alpha(0.5)", "alpha(0.7)", "alpha(-1)", "neyman", "lecam",
          "tv", "pearson"]
INPUTS = ("llm", "mid")
COPY = "(copy)"


def worker(root: str) -> None:
    """Answer 'name<TAB>input<TAB>n<TAB>threads' lines on stdin with the ns/token of one measurement."""
    sys.path.insert(0, os.path.abspath(root))
    import numba
    import numpy as np

    import bandcore as bc
    from bandcore.tables import BandTable
    from bandcore.tools.bench_inputs import log_probs

    @numba.njit(parallel=True, cache=False)
    def copy(x, a, b):  # the roofline: read float32, write two float32
        for i in numba.prange(x.size):
            v = x[i]
            a[i] = v
            b[i] = -v

    inputs, tables = {}, {}
    print("ready", bc.__file__, flush=True)
    for line in sys.stdin:
        name, which, n, threads = line.rstrip("\n").split("\t")
        n = int(n)
        numba.set_num_threads(int(threads))
        if (which, n) not in inputs:
            inputs[(which, n)] = log_probs(which, n, 0)
        x = inputs[(which, n)]
        if name == COPY:
            call = functools.partial(copy, x, np.empty_like(x), np.empty_like(x))
        else:
            call = functools.partial(tables.setdefault(name, BandTable.shipped(name, 0.05)).log, x, backend="numba")
        call()
        calls = max(3, min(50, 2_000_000 // n))
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        print(statistics.median(times) * 1e9 / n, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tables", nargs="*", default=TABLES)
    parser.add_argument("--threads", nargs="*", type=int, default=[1, 2])
    parser.add_argument("--sizes", nargs="*", type=int, default=[500_000])
    parser.add_argument("--copy", action="store_true", help="add the copy roofline row")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.before)
    workers = start_workers(__file__, {"before": args.before, "after": args.after})
    rows = [(name, which, n, t) for name in args.tables + ([COPY] if args.copy else []) for which in INPUTS
            for n in args.sizes for t in args.threads]  # fmt: skip
    times = interleaved(workers, rows, args.reps)
    print(f"{'table':12s} {'input':5s} {'n':>8s} {'thr':>3s} {'before':>8s} {'after':>8s} {'x':>6s}"
          f"   ns/token, median of {args.reps}")  # fmt: skip
    for row in rows:
        before, after = (statistics.median(times[(*row, tag)]) for tag in ("before", "after"))
        print(f"{row[0]:12s} {row[1]:5s} {row[2]:8d} {row[3]:3d} {before:8.2f} {after:8.2f} {before / after:6.2f}")


if __name__ == "__main__":
    main()
