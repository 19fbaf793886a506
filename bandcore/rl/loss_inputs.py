"""The loss's input contract: types, dtypes, shapes and devices always; values in one host synchronisation.

Used by :mod:`bandcore.rl.loss`; see :func:`check_policy_loss_inputs`.
"""

from __future__ import annotations

import torch

from bandcore._contract import LOG_P_TOLERANCE

__all__ = ["check_policy_loss_inputs"]


def _shape(x: torch.Tensor) -> tuple[int, ...]:
    return tuple(x.shape)


def _check_structure(log_prob, old_log_prob, advantages, mask, log_bounds, anchor_log_prob=None) -> None:
    """Types, dtypes, shapes and devices (no host synchronisation)."""
    tensors = [("log_prob", log_prob), ("old_log_prob", old_log_prob), ("advantages", advantages), ("mask", mask)]
    if anchor_log_prob is not None:
        tensors.append(("anchor_log_prob", anchor_log_prob))
    for name, value in tensors:
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    for name, value in tensors:
        if name != "mask" and not value.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    if mask.is_complex():
        raise TypeError(f"mask must be a bool, integer or floating-point tensor, got dtype {mask.dtype}")
    if log_prob.ndim != 2:
        raise ValueError(f"log_prob must have shape (B, T), got shape {_shape(log_prob)}")
    shape = _shape(log_prob)
    for name, value in tensors[1:]:
        if name != "advantages" and _shape(value) != shape:
            raise ValueError(f"{name} must have the shape of log_prob {shape}, got {_shape(value)}")
    if _shape(advantages) not in ((shape[0],), (shape[0], 1), shape):
        raise ValueError(
            f"advantages must have shape (B,), (B, 1) or (B, T) with (B, T) = {shape} the shape of log_prob, "
            f"got {_shape(advantages)}"
        )
    named = tensors[1:]
    if log_bounds is not None:
        if not (isinstance(log_bounds, (tuple, list)) and len(log_bounds) == 2
                and all(isinstance(b, torch.Tensor) for b in log_bounds)):
            raise TypeError(f"log_bounds must be a pair (log_lower, log_upper) of tensors, got {log_bounds!r:.80}")
        if any(_shape(b) != shape for b in log_bounds):
            raise ValueError(f"log_bounds must be two tensors of shape {shape} (the shape of log_prob), "
                             f"got {[_shape(b) for b in log_bounds]}")
        if not all(b.is_floating_point() for b in log_bounds):
            raise TypeError(f"log_bounds must be floating-point tensors, got {[b.dtype for b in log_bounds]}")
        named += [("log_bounds[0]", log_bounds[0]), ("log_bounds[1]", log_bounds[1])]
    for name, value in named:
        if value.device != log_prob.device:
            raise ValueError(f"{name} is on {value.device} but log_prob is on {log_prob.device}")


def check_policy_loss_inputs(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    log_bounds: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    values: bool = True,
    anchor_log_prob: torch.Tensor | None = None,
) -> None:
    r"""Raise ``TypeError`` / ``ValueError`` naming the first input that breaks the loss's contract.

    Structure (always, no synchronisation): tensors, floating dtypes, ``log_prob`` (B, T), ``old_log_prob`` and
    ``mask`` (B, T), ``advantages`` (B,), (B, 1) or (B, T), ``log_bounds`` two (B, T) tensors, one device.
    Values (``values=True``; every test is a tensor reduction, all of them read back in one host
    synchronisation): ``mask`` :math:`\ge 0` and not NaN; at tokens with ``mask != 0``: ``advantages`` finite,
    ``old_log_prob`` and ``anchor_log_prob`` :math:`\le 10^{-6}`, ``log_bounds`` not NaN with
    :math:`\log l \le \log u`.
    """
    _check_structure(log_prob, old_log_prob, advantages, mask, log_bounds, anchor_log_prob)
    if not values or log_prob.numel() == 0:
        return
    with torch.no_grad():
        valid = mask != 0
        adv = advantages.detach()
        adv = adv[:, None] if adv.ndim == 1 else adv
        old = old_log_prob.detach()
        tests = {
            "mask_nan": torch.isnan(mask).any() if mask.is_floating_point() else None,
            "mask_negative": (mask < 0).any() if mask.dtype != torch.bool else None,
            "advantages": (valid & ~torch.isfinite(adv)).any(),
            "old_log_prob": (valid & (old > LOG_P_TOLERANCE)).any(),
        }
        if anchor_log_prob is not None:
            anchor = anchor_log_prob.detach()
            tests["anchor_log_prob"] = (valid & (anchor > LOG_P_TOLERANCE)).any()
        if log_bounds is not None:
            lower, upper = (b.detach() for b in log_bounds)
            tests["bounds_nan"] = (valid & (torch.isnan(lower) | torch.isnan(upper))).any()
            tests["bounds_order"] = (valid & (lower > upper)).any()
        keys = [k for k, v in tests.items() if v is not None]
        flags = dict(zip(keys, torch.stack([tests[k] for k in keys]).tolist(), strict=True))  # one host sync
    if not any(flags.values()):
        return
    if flags.get("mask_nan"):
        raise ValueError(f"mask must not hold NaN, got {int(torch.isnan(mask).sum())} NaN value(s)")
    if flags.get("mask_negative"):
        negative = mask[mask < 0]
        raise ValueError(f"mask must be >= 0 (token weights), got {negative.numel()} negative value(s), "
                         f"e.g. mask={float(negative[0])!r}")
    if flags["advantages"]:
        bad = adv.expand_as(valid)[valid & ~torch.isfinite(adv)]
        raise ValueError(f"advantages must be finite at unmasked tokens, got {bad.numel()} non-finite value(s), "
                         f"e.g. advantages={float(bad[0])!r}")
    if flags["old_log_prob"]:
        bad = old[valid & (old > LOG_P_TOLERANCE)]
        raise ValueError(
            f"old_log_prob must be <= 0 at unmasked tokens (log-probabilities; up to {LOG_P_TOLERANCE:g} is read "
            f"as 0), got {bad.numel()} value(s) above, e.g. old_log_prob={float(bad[0])!r}"
        )
    if flags.get("anchor_log_prob"):
        bad = anchor[valid & (anchor > LOG_P_TOLERANCE)]
        raise ValueError(
            f"anchor_log_prob must be <= 0 at unmasked tokens (log-probabilities; up to {LOG_P_TOLERANCE:g} is "
            f"read as 0), got {bad.numel()} value(s) above, e.g. anchor_log_prob={float(bad[0])!r}"
        )
    if flags.get("bounds_nan"):
        raise ValueError("log_bounds must not be NaN at unmasked tokens, got NaN in "
                         f"{int((valid & (torch.isnan(lower) | torch.isnan(upper))).sum())} token(s)")
    if flags.get("bounds_order"):
        where = valid & (lower > upper)
        raise ValueError(f"log_bounds must have lower <= upper at unmasked tokens, got lower > upper in "
                         f"{int(where.sum())} token(s), e.g. ({float(lower[where][0])!r}, {float(upper[where][0])!r})")
