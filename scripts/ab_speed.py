"""Interleaved A/B timing of the Numba Band kernel of two bandcore source trees, in ns per token.

    git archive <commit> bandcore | tar -x -C /tmp/before
    NUMBA_NUM_THREADS=2 python scripts/ab_speed.py /tmp/before . --reps 5

Each tree runs in its own worker process (its own ``BANDCORE_CACHE``, so generated modules never mix); the
driver asks both for the same measurement in alternating order, rep after rep, and prints medians.  A
measurement is one ``band_log(x, name, 0.05, backend="numba")`` call on 1M float32 tokens, after a call on
1,000 of them (compiled modules and seed tables are built in the warm-up rep, which is not counted).  Two
inputs: LLM-like tokens (:func:`bandcore.tools.bench.llm_like_log_probs`) and mid probabilities,
log p = -2E with E ~ Exp(1).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from ab_workers import interleaved, start_workers

N = 1_000_000
DIVERGENCES = ["kl", "hellinger", "js", "alpha(0.7)", "log(cosh(u-1))", "log(1+exp(u-1)) - log(2) - (u-1)/2",
               "cosh(u-1) - 1", "exp(u-1) - u", "abs(u-1)**1.5", "abs(u-1)**3", "(u-1)**4",
               "u**(5/2) - 5*u/2 + 3/2", "max(u - 2, 0)", "where(abs(u-1) < 1, (u-1)**2/2, abs(u-1) - 1/2)"]
INPUTS = ("llm", "mid")


def worker(root: str) -> None:
    """Answer 'name<TAB>input' lines on stdin with the ns/token of one call (nan and a note on stderr if the
    tree cannot run it)."""
    sys.path.insert(0, os.path.abspath(root))
    import numpy as np

    import bandcore as bc
    from bandcore.tools.bench import llm_like_log_probs

    inputs = {"llm": llm_like_log_probs(N, seed=0),
              "mid": (-2.0 * np.random.default_rng(1).exponential(size=N)).astype(np.float32)}  # fmt: skip
    print("ready", bc.__file__, flush=True)
    for line in sys.stdin:
        name, which = line.rstrip("\n").split("\t")
        try:
            bc.band_log(inputs[which][:1000], name, 0.05, backend="numba")
            start = time.perf_counter()
            bc.band_log(inputs[which], name, 0.05, backend="numba")
            print((time.perf_counter() - start) * 1e9 / N, flush=True)
        except Exception as err:  # reported, and the other measurements go on
            print("nan", flush=True)
            print(f"{name}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--divergences", nargs="*", default=DIVERGENCES)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.before)
    workers = start_workers(__file__, {"before": args.before, "after": args.after})
    times = interleaved(workers, [(name, which) for name in args.divergences for which in INPUTS], args.reps)
    print(f"{'divergence':48s} {'input':5s} {'before':>8s} {'after':>8s}   ns/token, median of {args.reps}")
    for name in args.divergences:
        for which in INPUTS:
            before, after = (statistics.median(times[(name, which, tag)]) for tag in ("before", "after"))
            print(f"{name:48s} {which:5s} {before:8.1f} {after:8.1f}")


if __name__ == "__main__":
    main()
