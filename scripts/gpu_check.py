"""GPU check for the torch paths: accuracy on the device (fp32/fp64) vs the mpmath oracle, torch.compile,
and throughput against the device's copy bandwidth (the HBM roofline on a GPU).

    python scripts/gpu_check.py                     # CUDA, 10M tokens
    python scripts/gpu_check.py --device cpu --n 20000 --json out.json

Checks (each reported, exit status 1 if any fails):
  * ``band_log(..., backend="torch")`` on the device for kl, tv, pearson on a grid of log p in [-700, 0):
    float64 inputs within the contract 1e-12; float32 inputs within float32 rounding (2^-23 relative);
  * the lookup-table torch path (shipped tables) within its certified error;
  * ``torch.compile`` of both gives the eager results;
  * throughput (Mtok/s) of both and of a device copy of the float32 input; a Band evaluation moves
    3 x 4 bytes per token (input + two outputs), so roofline Mtok/s = copy bandwidth / 12 bytes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from bandcore import BandTable, band_log
from bandcore.bench import llm_like_log_probs, rel_log_error
from bandcore.oracle import reference_band_log

DIVERGENCES = ("kl", "tv", "pearson")
DELTA = 0.05


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
    print(f"[{'ok' if ok else 'FAIL'}] {name} {details}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--n", type=int, default=10_000_000, help="tokens for the throughput runs")
    parser.add_argument("--points", type=int, default=40, help="grid points for the accuracy checks")
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    report = {"device": str(device), "name": torch.cuda.get_device_name(device) if device.type == "cuda" else
              "cpu", "torch": torch.__version__, "checks": [], "throughput": {}}  # fmt: skip
    grid = -np.logspace(-12, np.log10(700), args.points)
    for div in DIVERGENCES:
        exact_lo, exact_up = reference_band_log(div, grid, DELTA)
        table = BandTable.shipped(div, DELTA)
        for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 2.0**-23)):
            x = torch.tensor(grid, dtype=dtype, device=device)
            ref_lo, ref_up = reference_band_log(div, x.double().cpu().numpy(), DELTA) if dtype != torch.float64 \
                else (exact_lo, exact_up)  # fmt: skip
            if dtype == torch.float32:  # the best a float32 output can hold (KL's lower bound overflows to -inf)
                ref_lo, ref_up = (r.astype(np.float32).astype(np.float64) for r in (ref_lo, ref_up))
            try:
                lo, up = band_log(x, div, DELTA, backend="torch")
                err = max(rel_log_error(v.double().cpu().numpy(), r).max() for v, r in ((lo, ref_lo), (up, ref_up)))
                _check(report, f"band_log torch {div} {dtype}", err <= tol, max_rel_err=float(err), tol=tol)
            except Exception as exc:  # report and go on: every check is listed
                _check(report, f"band_log torch {div} {dtype}", False, error=f"{type(exc).__name__}: {exc}")
            lo, up = table.log(x)
            err = max(rel_log_error(v.double().cpu().numpy(), r).max() for v, r in ((lo, ref_lo), (up, ref_up)))
            tol_t = table.max_rel_error + (0 if dtype == torch.float64 else 2.0**-23)
            _check(report, f"table torch {div} {dtype}", err <= tol_t, max_rel_err=float(err), tol=tol_t)
    x = torch.from_numpy(llm_like_log_probs(args.n)).to(device)
    table = BandTable.shipped("kl", DELTA)
    fns = {"band_log_torch_kl": lambda t: band_log(t, "kl", DELTA, backend="torch"), "table_torch_kl": table.log}
    for name, fn in fns.items():
        try:
            compiled = torch.compile(fn)
            same = all(torch.equal(a, b) for a, b in zip(compiled(x[:4096]), fn(x[:4096]), strict=True))
            _check(report, f"torch.compile {name}", same)
            seconds = _best_time(fn, x, device)
            report["throughput"][name] = {"seconds": seconds, "mtok_s": args.n / seconds / 1e6}
        except Exception as exc:
            _check(report, f"torch.compile {name}", False, error=f"{type(exc).__name__}: {exc}")
    copy_s = _best_time(lambda t: t.clone(), x, device)
    roofline = 2 * x.numel() * x.element_size() / copy_s / 12 / 1e6
    report["throughput"]["copy"] = {"seconds": copy_s, "gb_per_s": 2 * x.numel() * 4 / copy_s / 1e9,
                                    "roofline_mtok_s": roofline}  # fmt: skip
    for name, row in report["throughput"].items():
        if name != "copy":
            row["roofline_fraction"] = row["mtok_s"] / roofline
        print(f"{name}: {json.dumps(row)}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
    return 0 if all(c["ok"] for c in report["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
