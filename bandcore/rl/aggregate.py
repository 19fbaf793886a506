"""Reducing a (B, T) per-token loss to a scalar: the aggregation modes of verl and the GRPO family."""

from __future__ import annotations

import torch

__all__ = ["LOSS_AGG_MODES", "aggregate_loss"]

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum",
                  "seq-mean-token-sum-norm")


def _shape(x: torch.Tensor) -> tuple[int, ...]:
    return tuple(x.shape)


def aggregate_loss(
    loss_mat: torch.Tensor, mask: torch.Tensor, loss_agg_mode: str = "token-mean", *, norm_length: int | None = None
) -> torch.Tensor:
    r"""Reduce a (B, T) per-token loss to a scalar; ``mask`` weights tokens (bool or float).

    With :math:`m_{bt}` the mask, :math:`\ell_{bt}` the loss, :math:`S = \{b : \sum_t m_{bt} > 0\}` the
    non-empty sequences (fully masked rows are padding and excluded, as in verl):

    - ``token-mean`` (DAPO, verl's default): :math:`\sum_{bt} m\ell / \sum_{bt} m`;
    - ``token-sum``: :math:`\sum_{bt} m\ell`;
    - ``seq-mean-token-mean`` (original GRPO, the BandPO runs): :math:`\frac1{|S|}\sum_{b\in S}
      \sum_t m\ell / \sum_t m`;
    - ``seq-mean-token-sum``: :math:`\frac1{|S|}\sum_{b\in S}\sum_t m\ell`;
    - ``seq-mean-token-sum-norm`` (Dr. GRPO): :math:`\frac1{|S|\,L}\sum_{b\in S}\sum_t m\ell` with the constant
      :math:`L` = ``norm_length`` (default: the padded length T; pass the maximum generation length so
      the scale does not change with the batch).

    An empty mask gives 0.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {loss_agg_mode!r}")
    if _shape(mask) != _shape(loss_mat):
        raise ValueError(f"mask must have the shape of loss_mat {_shape(loss_mat)}, got {_shape(mask)}")
    weights = mask.to(loss_mat.dtype)
    tiny = torch.finfo(loss_mat.dtype).tiny
    token_sums = (loss_mat * weights).sum(dim=-1)
    token_counts = weights.sum(dim=-1)
    if loss_agg_mode == "token-mean":
        return token_sums.sum() / token_counts.sum().clamp_min(tiny)
    if loss_agg_mode == "token-sum":
        return token_sums.sum()
    non_empty = (token_counts > 0).to(loss_mat.dtype)
    num_seqs = non_empty.sum().clamp_min(1.0)
    if loss_agg_mode == "seq-mean-token-mean":
        return (token_sums / token_counts.clamp_min(tiny) * non_empty).sum() / num_seqs
    loss = (token_sums * non_empty).sum() / num_seqs
    if loss_agg_mode == "seq-mean-token-sum-norm":
        length = loss_mat.shape[-1] if norm_length is None else norm_length
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"norm_length must be a positive integer, got {norm_length!r}")
        loss = loss / length
    return loss
