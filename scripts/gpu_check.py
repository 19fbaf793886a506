"""GPU check for the torch paths: accuracy of every backend on the device (fp32/fp64) vs the mpmath oracle,
torch.compile of the pure torch solver, and throughput against the device's copy bandwidth (the HBM roofline).

    python scripts/gpu_check.py                     # CUDA, 10M tokens
    python scripts/gpu_check.py --device cpu --n 4096 --json out.json

Checks (each reported, exit status 1 if any fails):
  * ``band_log(x, div, delta, backend=b)`` with ``x`` on the device, for b in numpy, numba, torch and div in
    kl, tv, pearson, alpha(0.5), on a grid of log p in [-700, 0): float64 inputs within the contract 1e-12,
    float32 inputs within float32 rounding (2^-23 relative); the output stays on the input's device and dtype;
  * the lookup-table torch path (shipped tables) within its certified error;
  * ``torch.compile`` (inductor on CUDA, aot_eager on CPU) of ``bandcore.band.torch_function(div, delta)``
    (the pure torch solver) agrees with the eager function (same status, log bounds within 1e-12), and
    ``torch.compile`` of the table path is exact;
  * throughput (Mtok/s) of band_log per backend, of the compiled solver, of the table, and of a device copy
    of the float32 input; a Band evaluation moves 3 x 4 bytes per token (input + two outputs), so roofline
    Mtok/s = copy bandwidth / 12 bytes.  On a GPU the numpy and numba rows include the host transfers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from bandcore.band import band_log, torch_function
from bandcore.oracle import reference_band_log
from bandcore.tables import BandTable, rel_log_error
from benchmarks.bench import llm_like_log_probs

DIVERGENCES = ("kl", "tv", "pearson", "alpha(0.5)")
TABLE_DIVERGENCES = ("kl", "tv", "pearson")
#: torch.compile of torch_function: KL's own solver and the generic one (whose trace takes about a minute on a CPU)
COMPILED_DIVERGENCES = ("kl", "alpha(0.5)")
BACKENDS = ("numpy", "numba", "torch")
DELTA = 0.05
CONTRACT = 1e-12


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best_time(fn, arg, device, repeats=5):
    fn(arg)
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(arg)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def _check(report, name, ok, **details):
    report["checks"].append({"check": name, "ok": bool(ok), **details})
    print(f"[{'ok' if ok else 'FAIL'}] {name} {details}", flush=True)


def _max_err(pairs):
    return max(float(rel_log_error(v.double().cpu().numpy(), r).max()) for v, r in pairs)


def _accuracy(report, grid, device):
    for div in DIVERGENCES:
        exact = reference_band_log(div, grid, DELTA)
        table = BandTable.shipped(div, DELTA) if div in TABLE_DIVERGENCES else None
        for dtype, tol in ((torch.float64, CONTRACT), (torch.float32, 2.0**-23)):
            x = torch.tensor(grid, dtype=dtype, device=device)
            ref = exact
            if dtype == torch.float32:  # the best a float32 output can hold (KL's lower bound overflows to -inf)
                ref = reference_band_log(div, x.double().cpu().numpy(), DELTA)
                with np.errstate(over="ignore"):
                    ref = tuple(r.astype(np.float32).astype(np.float64) for r in ref)
            for backend in BACKENDS:
                name = f"band_log {backend} {div} {dtype}"
                try:
                    out = band_log(x, div, DELTA, backend=backend)
                    placed = all(v.device == x.device and v.dtype == dtype for v in out)
                    err = _max_err(zip(out, ref, strict=True))
                    _check(report, name, placed and err <= tol, max_rel_err=err, tol=tol, same_device=placed)
                except Exception as exc:  # report and go on: every check is listed
                    _check(report, name, False, error=f"{type(exc).__name__}: {exc}")
            if table is not None:
                err = _max_err(zip(table.log(x), ref, strict=True))
                tol_t = table.max_rel_error + (0 if dtype == torch.float64 else 2.0**-23)
                _check(report, f"table torch {div} {dtype}", err <= tol_t, max_rel_err=err, tol=tol_t)


def _compiled(report, x, device, n, backend, divergences=COMPILED_DIVERGENCES):
    """torch.compile checks and the throughput rows; returns nothing, fills report["throughput"]."""
    x64 = x.double()
    probe = x64[:4096]
    for div in divergences:
        eager = torch_function(div, DELTA)
        name = f"torch.compile torch_function {div}"
        try:
            compiled = torch.compile(eager, backend=backend)
            got, want = compiled(probe), eager(probe)
            same_status = bool(torch.equal(got[2].cpu(), want[2].cpu()))
            err = _max_err(((got[0], want[0].cpu().numpy()), (got[1], want[1].cpu().numpy())))
            _check(report, name, same_status and err <= CONTRACT, max_rel_err_vs_eager=err, same_status=same_status)
            if div == "kl":
                seconds = _best_time(compiled, x64, device)
                report["throughput"]["torch_function_compiled_kl"] = {"seconds": seconds, "mtok_s": n / seconds / 1e6}
        except Exception as exc:
            _check(report, name, False, error=f"{type(exc).__name__}: {exc}")
    table = BandTable.shipped("kl", DELTA)
    try:
        compiled = torch.compile(table.log, backend=backend)
        same = all(torch.equal(a, b) for a, b in zip(compiled(x[:4096]), table.log(x[:4096]), strict=True))
        _check(report, "torch.compile table_torch_kl", same)
    except Exception as exc:
        _check(report, "torch.compile table_torch_kl", False, error=f"{type(exc).__name__}: {exc}")
    fns = {f"band_log_{b}_kl": (lambda t, b=b: band_log(t, "kl", DELTA, backend=b)) for b in BACKENDS}
    fns["table_torch_kl"] = table.log
    for name, fn in fns.items():
        try:
            seconds = _best_time(fn, x, device)
            report["throughput"][name] = {"seconds": seconds, "mtok_s": n / seconds / 1e6}
        except Exception as exc:
            _check(report, f"throughput {name}", False, error=f"{type(exc).__name__}: {exc}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--n", type=int, default=10_000_000, help="tokens for the throughput runs")
    parser.add_argument("--points", type=int, default=40, help="grid points for the accuracy checks")
    parser.add_argument("--json", help="write the report here")
    parser.add_argument(
        "--compile-backend",
        help="torch.compile backend (default: inductor on CUDA; aot_eager on CPU, where inductor's C++ build of "
        "the unrolled solver takes many minutes)",
    )
    parser.add_argument("--compile", nargs="+", default=list(COMPILED_DIVERGENCES), metavar="DIVERGENCE",
                        help="divergences whose torch_function is compiled (default: %(default)s)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    compile_backend = args.compile_backend or ("inductor" if device.type == "cuda" else "aot_eager")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report = {"device": str(device), "name": name, "torch": torch.__version__, "compile_backend": compile_backend}
    report.update(checks=[], throughput={})
    _accuracy(report, -np.logspace(-12, np.log10(700), args.points), device)
    x = torch.from_numpy(llm_like_log_probs(args.n)).to(device)
    _compiled(report, x, device, args.n, compile_backend, args.compile)
    copy_s = _best_time(lambda t: t.clone(), x, device)
    roofline = 2 * x.numel() * x.element_size() / copy_s / 12 / 1e6
    report["throughput"]["copy"] = {
        "seconds": copy_s,
        "gb_per_s": 2 * x.numel() * x.element_size() / copy_s / 1e9,
        "roofline_mtok_s": roofline,
    }
    for key, row in report["throughput"].items():
        if key != "copy":
            row["roofline_fraction"] = row["mtok_s"] / roofline
        print(f"{key}: {json.dumps(row)}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
    return 0 if all(c["ok"] for c in report["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
