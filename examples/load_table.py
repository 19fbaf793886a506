"""Standalone Band lookup from a bandcore 1-D .npz table: NumPy only, no bandcore needed.
Usage: python load_table.py tables/kl_delta0.05.npz -3.0 -0.1   (old log-probs) -> log r_lo, log r_up"""
import json
import sys

import numpy as np


def load(path):
    with np.load(path, allow_pickle=False) as z:  # never unpickle
        return {k: z[k] for k in z.files if k != "__metadata__"}, json.loads(z["__metadata__"].tobytes())


def bound(a, meta, side, x, log_p):
    k, v, d, kind = a[side + "_knots"], a[side + "_values"], a[side + "_slopes"], meta[side + "_kind"]
    j = np.clip(np.searchsorted(k, x) - 1, 0, len(k) - 2)
    h = k[j + 1] - k[j]
    s = np.clip((x - k[j]) / h, 0, 1)  # cubic Hermite in x = logit p on [k_j, k_j+1]
    f = (2*s**3 - 3*s**2 + 1)*v[j] + (s**3 - 2*s**2 + s)*h*d[j] + (3*s**2 - 2*s**3)*v[j+1] + (s**3 - s**2)*h*d[j+1]
    f = np.where(x < k[0], v[0] + d[0] * np.minimum(x - k[0], 0), f)  # left: linear; right: end value
    with np.errstate(divide="ignore", over="ignore"):
        y = f if kind == 0 else np.log(np.clip(f, 0, 1)) if kind == 1 else -np.exp(f)  # stored: log r | r | log(-log r)
    if side == "upper":
        y, sat = np.minimum(np.maximum(y, 0), -log_p), meta["upper_saturated_at_or_above_x"]  # 1 <= r_up <= 1/p
        return y if sat is None else np.where(x >= sat, -log_p, y)  # saturated: r = 1/p
    sat = meta["lower_saturated_at_or_below_x"]
    return y if sat is None else np.where(x <= sat, -np.inf, y)  # saturated: r = 0


def band_log(path, old_log_prob):
    a, meta = load(path)
    lp = np.minimum(np.asarray(old_log_prob, dtype=np.float64), 0.0)
    with np.errstate(divide="ignore"):
        x = lp - np.log(-np.expm1(lp))  # logit p, exact near p = 1
    return bound(a, meta, "lower", x, lp), bound(a, meta, "upper", x, lp)


if __name__ == "__main__":
    for lp, lo, up in zip(sys.argv[2:], *band_log(sys.argv[1], [float(v) for v in sys.argv[2:]]), strict=True):
        print(f"log p = {lp}: log r in [{lo:.12g}, {up:.12g}]")
