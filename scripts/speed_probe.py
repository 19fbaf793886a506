"""Speed probe: ns/token of the exact solvers (Numba, torch on the CPU), the lookup tables and the published
solver, as medians of interleaved rounds in one process, on two input distributions, plus fallback counts.

    PYTHONPATH=. python scripts/speed_probe.py [--rounds 7] [--threads 2] [--n 1000000] [--only kl,js]

(``PYTHONPATH=.``: a script's own folder, not the working directory, is on its path, so without it an installed
bandcore may be imported instead of this checkout's.)

Distributions (float32): ``llm`` (:func:`bandcore.tools.bench.llm_like_log_probs`) and ``mid``
(log p = -2E, E ~ Exp(1)).  Every method runs on ``--threads`` threads (Numba and torch); the ratio column is
the published KL solver's time over the method's, on the same input.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numba
import numpy as np
import torch

import bandcore as bc
from bandcore.divergences import resolve
from bandcore.kernels import backends
from bandcore.tables import BandTable
from bandcore.tools.bench import llm_like_log_probs
from bandcore.tools.published import published_band

DIVERGENCES = ("kl", "hellinger", "js", "alpha(3)", "reverse_kl", "lecam", "alpha(0.5)", "tv", "pearson")
DELTA = 0.05


def inputs(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"llm": llm_like_log_probs(n, 0), "mid": (-2.0 * rng.exponential(size=n)).astype(np.float32)}


def fallbacks(divergence: str, x: np.ndarray) -> tuple[float, float]:
    """(fraction of tokens the seeded pass leaves, fraction the refined passes then leave to the safeguarded
    solver), on the first 200k tokens."""
    div = resolve(divergence)
    kind = backends.solver_kind(div)
    if kind not in ("kl", "generic"):
        return 0.0, 0.0
    module = backends.solver_module("numpy", div)
    lp = x.astype(np.float64)[:200_000]
    seed = backends.seed(div, DELTA).numpy_arrays()
    at_one = backends.lower_at_one(div, DELTA)
    with np.errstate(all="ignore"):
        _, _, status, *offsets = getattr(module, module.POLISHED[kind])(lp, DELTA, at_one, *module.seed_pair(lp, seed))
        redo = status == module.NOT_CONVERGED
        left = lp[redo]
        polished_left = left.size / lp.size
        if kind in module.REFINED:
            offsets = [d[redo] for d in offsets]
            for _ in range(module.REFINE_PASSES):  # as the backends: each pass from the offsets the last returned
                if not left.size:
                    break
                _, _, status, *offsets = getattr(module, module.REFINED[kind])(left, DELTA, at_one, *offsets)
                keep = status == module.NOT_CONVERGED
                left, offsets = left[keep], [d[keep] for d in offsets]
    return polished_left, left.size / lp.size


def methods(divergence: str, table: bool) -> dict:
    out = {
        "numba": lambda x: bc.band_log(x, divergence, DELTA, backend="numba"),
        "torch": lambda t: bc.band_log(t, divergence, DELTA, backend="torch"),
    }
    if table:
        try:
            tab = BandTable.shipped(divergence, DELTA)
        except FileNotFoundError:
            tab = None
        if tab is not None:
            out["table"] = lambda x: tab.log(x, backend="numba")
    if divergence in ("tv", "pearson"):
        out["pub-closed"] = lambda t: published_band(t, divergence, DELTA)
    return out


def timed(fn, arg, min_seconds: float) -> float:
    """Seconds per call: back-to-back calls for at least ``min_seconds``."""
    calls, start = 0, time.perf_counter()
    while True:
        fn(arg)
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return elapsed / calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--only", default=",".join(DIVERGENCES))
    parser.add_argument("--min-seconds", type=float, default=0.05)
    parser.add_argument("--no-table", action="store_true")
    parser.add_argument("--no-fallbacks", action="store_true")
    args = parser.parse_args()
    numba.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    data = inputs(args.n)
    tensors = {k: torch.from_numpy(v) for k, v in data.items()}
    divergences = args.only.split(",")
    if not args.no_fallbacks:
        for d in divergences:
            print(d, "left by the seeded pass, then by the refined pass",
                  {k: tuple(round(f, 5) for f in fallbacks(d, v)) for k, v in data.items()}, flush=True)  # fmt: skip
    work = {(d, name, dist): fn for d in divergences for name, fn in methods(d, not args.no_table).items()
            for dist in data}  # fmt: skip
    for dist in data:
        work[("kl", "published", dist)] = lambda t: published_band(t, "kl", DELTA)
    times: dict = {key: [] for key in work}
    for key, fn in work.items():  # warm up (compiles)
        fn(tensors[key[2]] if key[1] in ("torch", "published", "pub-closed") else data[key[2]])
    for _ in range(args.rounds):
        for key, fn in work.items():
            arg = tensors[key[2]] if key[1] in ("torch", "published", "pub-closed") else data[key[2]]
            times[key].append(timed(fn, arg, args.min_seconds))
    print(f"n = {args.n}, threads = {args.threads}, rounds = {args.rounds}; ns/token median [min-max]; "
          "ratio = published KL / method (closed forms: published closed form / method)")  # fmt: skip
    for key in work:
        d, name, dist = key
        med = statistics.median(times[key])
        pub = statistics.median(times[("kl", "published", dist)])
        if d in ("tv", "pearson") and name in ("numba", "torch", "table"):
            pub = statistics.median(times[(d, "pub-closed", dist)])
        # ratio per round (interleaved), then its median and range
        ratios = [p / t for p, t in zip(times[("kl", "published", dist)], times[key], strict=True)]
        if d in ("tv", "pearson") and name in ("numba", "torch", "table"):
            ratios = [p / t for p, t in zip(times[(d, "pub-closed", dist)], times[key], strict=True)]
        print(f"{d:12s} {name:11s} {dist:4s} {1e9 * med / args.n:9.2f} ns  x{pub / med:7.2f} "
              f"[{min(ratios):.2f}-{max(ratios):.2f}]", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
