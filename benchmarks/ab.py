"""Interleaved A/B timing of two bandcore source trees, in ns per token: the exact solver (Numba, or another forced
backend) or the table lookup.

    git archive <commit> bandcore | tar -x -C /tmp/before
    python -m benchmarks.ab speed /tmp/before . --reps 5          # band_log(x, name, 0.05, backend="numba")
    python -m benchmarks.ab speed /tmp/before . --output ratio --threads 1 --inputs llm mid flat --n 500000 --cpu-time
    python -m benchmarks.ab speed /tmp/before . --backend torch --output ratio --threads 1 --n 10000 --cpu-time
    python -m benchmarks.ab lookup /tmp/before . --threads 1 2    # BandTable.shipped(name, 0.05).log(x, "numba")
    python -m benchmarks.ab lookup /tmp/before . --output ratio --sizes 10000 --threads 1 --cpu-time  # table(x)

Each tree runs in its own worker process (``python -m benchmarks.ab KIND TREE - --worker``, its own
``BANDCORE_CACHE``, so generated modules never mix; the tree is put first on the worker's path).  The driver asks
both workers for the same measurement in alternating order, rep after rep, and prints medians; rep 0 (compiling,
seed tables) is not counted.  Inputs are the benchmark's own float32 distributions (:func:`benchmarks.inputs.
log_probs`, ``llm`` and ``mid`` unless ``--inputs`` says otherwise, seed 0), the same for both trees.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TAGS = ("before", "after")
INPUTS = ("llm", "mid")
COPY = "(copy)"
DIVERGENCES = ["kl", "hellinger", "js", "alpha(0.7)", "log(cosh(u-1))", "log(1+exp(u-1)) - log(2) - (u-1)/2",
               "cosh(u-1) - 1", "exp(u-1) - u", "abs(u-1)**1.5", "abs(u-1)**3", "(u-1)**4",
               "u**(5/2) - 5*u/2 + 3/2", "max(u - 2, 0)", "where(abs(u-1) < 1, (u-1)**2/2, abs(u-1) - 1/2)"]


def start_workers(kind: str, trees: dict[str, str], n: int, extra: tuple[str, ...] = ()) -> dict[str, subprocess.Popen]:
    """One worker process per tree; each prints one 'ready ...' line, echoed here."""
    workers = {}
    for tag in TAGS:
        env = dict(os.environ, BANDCORE_CACHE=tempfile.mkdtemp(prefix=f"ab-{tag}-"))
        workers[tag] = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.ab", kind, os.path.abspath(trees[tag]), "-", "--worker", "--n", str(n),
             *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=Path(__file__).parents[1],
        )  # fmt: skip
        print(tag, workers[tag].stdout.readline().strip(), flush=True)
    return workers


def stop_workers(workers: dict[str, subprocess.Popen]) -> None:
    """Close each worker's input (it then ends), wait for it and close its output."""
    for worker in workers.values():
        worker.stdin.close()
        worker.wait(timeout=60)
        worker.stdout.close()


def interleaved(workers: dict[str, subprocess.Popen], rows: list[tuple], reps: int) -> dict[tuple, list[float]]:
    """{(*row, tag): the reps' answers}: each row sent tab-separated to both workers, in alternating order."""
    times: dict[tuple, list[float]] = {}
    for rep in range(reps + 1):
        for row in rows:
            for tag in TAGS if rep % 2 else TAGS[::-1]:
                workers[tag].stdin.write("\t".join(map(str, row)) + "\n")
                workers[tag].stdin.flush()
                value = float(workers[tag].stdout.readline())
                if rep:
                    times.setdefault((*row, tag), []).append(value)
    return times


def _speed_worker(n: int, clock=time.perf_counter, backend: str = "numba") -> None:
    """Answer 'name<TAB>input<TAB>threads<TAB>output' lines with the ns/token of one exact call on ``backend`` on
    ``threads`` threads (Numba's and torch's), of band_log (output "log") or band (output "ratio"), on the float32
    inputs (torch: as CPU tensors, as trainers hold them, with the Numba kernels for the tokens its seeded pass
    leaves made ready, as in the bench): the median of three calls (nan, and a note on stderr, if the tree cannot
    run it).  The benchmarks of this tree serve both workers."""
    import numba

    import bandcore as bc
    from benchmarks.inputs import log_probs
    from benchmarks.methods import ready_leftover_kernels

    inputs = {which: log_probs(which, n, 0) for which in ("llm", "mid", "flat")}
    if backend == "torch":
        import torch

        inputs = {which: torch.from_numpy(x) for which, x in inputs.items()}
    print("ready", bc.__file__, flush=True)
    for line in sys.stdin:
        name, which, threads, output = line.rstrip("\n").split("\t")
        numba.set_num_threads(int(threads))
        if backend == "torch":
            torch.set_num_threads(int(threads))
        call = bc.band if output == "ratio" else bc.band_log
        try:
            if backend == "torch":  # as the bench's torch row: the tokens torch's seeded pass leaves go to Numba
                ready_leftover_kernels(name, 0.05)
            call(inputs[which][:1000], name, 0.05, backend=backend)
            times = []
            for _ in range(3):
                start = clock()
                call(inputs[which], name, 0.05, backend=backend)
                times.append((clock() - start) * 1e9 / n)
            print(statistics.median(times), flush=True)
        except Exception as err:  # reported, and the other measurements go on
            print("nan", flush=True)
            print(f"{name}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)


def _lookup_worker(clock=time.perf_counter) -> None:
    """Answer 'name<TAB>input<TAB>n<TAB>threads<TAB>output' lines with the median ns/token of table lookups (both
    bounds): ``table.log`` (output "log") or ``table(x)``, the ratio bounds (output "ratio")."""
    import numba
    import numpy as np

    import bandcore as bc
    from bandcore.tables import BandTable
    from benchmarks.inputs import log_probs

    @numba.njit(parallel=True, cache=False)
    def copy(x, a, b):  # the roofline: read float32, write two float32
        for i in numba.prange(x.size):
            v = x[i]
            a[i] = v
            b[i] = -v

    inputs, tables = {}, {}
    print("ready", bc.__file__, flush=True)
    for line in sys.stdin:
        name, which, n, threads, output = line.rstrip("\n").split("\t")
        n = int(n)
        numba.set_num_threads(int(threads))
        x = inputs.setdefault((which, n), log_probs(which, n, 0))
        if name == COPY:
            call = functools.partial(copy, x, np.empty_like(x), np.empty_like(x))
        else:
            table = tables.setdefault(name, BandTable.shipped(name, 0.05))
            call = functools.partial(table if output == "ratio" else table.log, x, backend="numba")
        call()
        times = []
        for _ in range(max(3, min(50, 2_000_000 // n))):
            start = clock()
            call()
            times.append(clock() - start)
        print(statistics.median(times) * 1e9 / n, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=("speed", "lookup"))
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--names", nargs="*", help="divergences (speed) or tables (lookup); default: a fixed list")
    parser.add_argument("--n", type=int, default=1_000_000, help="speed: tokens per call (default 1M)")
    parser.add_argument("--threads", nargs="*", type=int, default=[1, 2], help="thread counts")
    parser.add_argument("--output", choices=("log", "ratio"), default="log",
                        help="band_log or band (speed), table.log or table(x) (lookup)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="the process's CPU time, not wall time (on 1 thread: robust to other load)")
    parser.add_argument("--inputs", nargs="*", choices=("llm", "mid", "flat"), default=list(INPUTS),
                        help="the benchmark's distributions timed")
    parser.add_argument("--sizes", nargs="*", type=int, default=[500_000], help="lookup: token counts")
    parser.add_argument("--backend", choices=("numba", "torch", "numpy"), default="numba",
                        help="speed: the backend forced (torch: float32 CPU tensors)")
    parser.add_argument("--copy", action="store_true", help="lookup: add the copy roofline row")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        sys.path.insert(0, os.path.abspath(args.before))  # this worker's tree first: its bandcore is timed
        clock = time.process_time if args.cpu_time else time.perf_counter
        return _speed_worker(args.n, clock, args.backend) if args.kind == "speed" else _lookup_worker(clock)
    workers = start_workers(args.kind, {"before": args.before, "after": args.after}, args.n,
                            ("--cpu-time",) * args.cpu_time + ("--backend", args.backend))
    if args.kind == "speed":
        rows = [(name, which, t, args.output) for name in args.names or DIVERGENCES for which in args.inputs
                for t in args.threads]  # fmt: skip
        header = f"{'divergence':48s} {'input':5s} {'thr':>3s}"
    else:
        from bandcore.tables.shipped import SHIPPED_NAMES  # default: every shipped table

        names = (args.names or list(SHIPPED_NAMES)) + ([COPY] if args.copy else [])
        rows = [(name, which, n, t, args.output) for name in names for which in args.inputs for n in args.sizes
                for t in args.threads]  # fmt: skip
        header = f"{'table':12s} {'input':5s} {'n':>8s} {'thr':>3s}"
    try:
        times = interleaved(workers, rows, args.reps)
    finally:
        stop_workers(workers)
    print(f"{header} {'before':>8s} {'after':>8s} {'x':>6s}   ns/token, median of {args.reps}")
    for row in rows:
        before, after = (statistics.median(times[(*row, tag)]) for tag in TAGS)
        label = f"{row[0]:48s} {row[1]:5s} {row[2]:3d}" if args.kind == "speed" else \
            f"{row[0]:12s} {row[1]:5s} {row[2]:8d} {row[3]:3d}"  # fmt: skip
        print(f"{label} {before:8.2f} {after:8.2f} {before / after:6.2f}")


if __name__ == "__main__":
    main()
