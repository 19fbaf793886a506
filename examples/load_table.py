"""Standalone Band lookup from a bandcore 1-D .npz table (format 2): NumPy only, no bandcore needed.
Usage: python load_table.py bandcore/tables/data/kl_delta0.05.npz -3.0 -0.1   (old log-probs) -> log r_lo, log r_up"""
import json
import sys

import numpy as np


def load(path):
    with np.load(path, allow_pickle=False) as z:  # never unpickle
        return {k: z[k] for k in z.files if k != "__metadata__"}, json.loads(z["__metadata__"].tobytes())


def hermite(k, v, d, x):  # cubic Hermite on knots k (values v, slopes d); end value left of k, end tangent right
    j = np.clip(np.searchsorted(k, x) - 1, 0, len(k) - 2)
    w = k[j + 1] - k[j]
    s = np.clip((x - k[j]) / w, 0, 1)
    f = (2*s**3 - 3*s**2 + 1)*v[j] + (s**3 - 2*s**2 + s)*w*d[j] + (3*s**2 - 2*s**3)*v[j+1] + (s**3 - s**2)*w*d[j+1]
    with np.errstate(invalid="ignore"):
        return np.where(x <= k[0], v[0], np.where(x >= k[-1], v[-1] + (d[-1] * (x - k[-1]) if d[-1] else 0), f))


def bound(a, meta, side, L):
    k, kind, near, h = a[side + "_knots"], meta[side + "_kind"], side + "_near_", meta.get(side + "_near_power")
    if side + "_left_tail" in meta or side + "_right_tail" in meta:  # reverse_kl, (u-1)*log(u): use bandcore
        raise ValueError("a bound with logarithmic tails: read it with bandcore")
    f = hermite(k, a[side + "_values"], a[side + "_slopes"], L)  # stored: log r (0, 3, 5), r (1, 4), log(-log r) (2)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        y = {0: f, 5: f, 3: np.minimum(f, 0), 2: -np.exp(f)}.get(kind, np.log(np.clip(f, 0, 1)))
        if kind > 3:  # split at L* = hi + lo: near it G(lam) = log u - gamma log lam, lam = |L - L*|, u = r | 1 - p r
            (hi, lo), nk = meta[side + "_threshold"], a[near + "knots"]  # (or H = e^G where near_power = gamma)
            lam = (hi - L) + lo if kind == 4 else (L - hi) - lo
            g = (np.log if h else np.asarray)(hermite(nk, a[near + "values"], a[near + "slopes"], lam))
            g = np.minimum(g + meta[side + "_gamma"] * np.log(np.maximum(lam, nk[0])), 0)
            y = np.where(L < k[-1], y, g) if kind == 4 else np.where(L >= k[0], y, L + np.log1p(-np.exp(g)))
    if side == "upper":  # 1 <= r_up <= 1/p, r = 1/p where saturated
        y, sat = np.minimum(np.maximum(y, 0), L), meta["upper_saturated_at_or_below_L"]
        return y if sat is None else np.where(L <= sat, L, y)
    sat = meta["lower_saturated_at_or_above_L"]  # r = 0 where saturated
    return y if sat is None else np.where(L >= sat, -np.inf, y)


def band_log(path, old_log_prob):
    (a, meta), L = load(path), np.maximum(-np.asarray(old_log_prob, dtype=np.float64), 0.0)  # L = -log p, exact
    return bound(a, meta, "lower", L), bound(a, meta, "upper", L)


if __name__ == "__main__":
    for lp, lo, up in zip(sys.argv[2:], *band_log(sys.argv[1], [float(v) for v in sys.argv[2:]]), strict=True):
        print(f"log p = {lp}: log r in [{lo:.12g}, {up:.12g}]")
