"""Numeric Band solvers, one plain function per backend (the public wrapper is :mod:`bandcore.band`).

Every backend function takes ``(divergence, old_log_prob, delta)`` with ``old_log_prob`` already float64
(NumPy array, or torch tensor for torch) and returns ``(log_lower, log_upper)`` of the same shape, with the
kernel conventions: NaN or log p > 0 → NaN; log p = 0 → (log r_lo(p = 1), 0); log p = -inf → (-inf, +inf);
no input checks (those live in :func:`bandcore.band_log`).

* :func:`.numpy_backend.band_log` — the reference: vectorised safeguarded Newton for any divergence.
* :func:`.numba_backend.band_log` — the same solver compiled per divergence (generated module, disk-cached),
  parallel over tokens.
* :func:`.torch_backend.band_log` / :func:`.torch_backend.band_log_function` — the same solver in float64
  torch ops with a fixed iteration count (no host synchronisation; ``torch.compile``-able, device-agnostic).

All three route KL to :mod:`.kl` (Halley from an outer bound; Numba: from a per-δ start table, one Halley
correction) and TV / Pearson to their closed forms in :mod:`.closed`.  :mod:`.generic` turns a divergence's
SymPy generator into the cancellation-free numeric functions the solvers evaluate.
"""
