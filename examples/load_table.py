"""Standalone Band lookup from a bandcore 1-D .npz table (format 2): NumPy only, no bandcore needed.
Usage: python load_table.py bandcore/tables/data/kl_delta0.05.npz -3.0 -0.1   (old log-probs) -> log r_lo, log r_up"""
import json
import sys

import numpy as np


def load(path):
    with np.load(path, allow_pickle=False) as z:  # never unpickle
        return {k: z[k] for k in z.files if k != "__metadata__"}, json.loads(z["__metadata__"].tobytes())


def bound(a, meta, side, L):
    k, v, d, kind = a[side + "_knots"], a[side + "_values"], a[side + "_slopes"], meta[side + "_kind"]
    if kind > 3 or side + "_left_tail" in meta or side + "_right_tail" in meta:  # js, reverse_kl, alpha(0.7)
        raise ValueError("a bound split at its threshold or with logarithmic tails: read it with bandcore")
    j = np.clip(np.searchsorted(k, L) - 1, 0, len(k) - 2)
    w = k[j + 1] - k[j]
    s = np.clip((L - k[j]) / w, 0, 1)  # cubic Hermite in L = -log p on [k_j, k_j+1], slopes dF/dL
    f = (2*s**3 - 3*s**2 + 1)*v[j] + (s**3 - 2*s**2 + s)*w*d[j] + (3*s**2 - 2*s**3)*v[j+1] + (s**3 - s**2)*w*d[j+1]
    with np.errstate(invalid="ignore"):  # left of the knots: first value; right: tangent in L
        f = np.where(L <= k[0], v[0], np.where(L >= k[-1], v[-1] + (d[-1] * (L - k[-1]) if d[-1] else 0), f))
    with np.errstate(divide="ignore", over="ignore"):  # stored: log r (0, 3) | r (1) | log(-log r) (2)
        y = f if kind == 0 else np.log(np.clip(f, 0, 1)) if kind == 1 else -np.exp(f) if kind == 2 else np.minimum(f, 0)
    if side == "upper":
        y = np.minimum(np.maximum(y, 0), L)  # 1 <= r_up <= 1/p
        return y if meta["upper_saturated_at_or_below_L"] is None else np.where(L <= k[0], L, y)  # r = 1/p
    return y if meta["lower_saturated_at_or_above_L"] is None else np.where(L >= k[-1], -np.inf, y)  # r = 0


def band_log(path, old_log_prob):
    a, meta = load(path)
    L = np.maximum(-np.asarray(old_log_prob, dtype=np.float64), 0.0)  # L = -log p, exact
    return bound(a, meta, "lower", L), bound(a, meta, "upper", L)


if __name__ == "__main__":
    for lp, lo, up in zip(sys.argv[2:], *band_log(sys.argv[1], [float(v) for v in sys.argv[2:]]), strict=True):
        print(f"log p = {lp}: log r in [{lo:.12g}, {up:.12g}]")
