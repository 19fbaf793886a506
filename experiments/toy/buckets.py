r"""Clip fractions and ratio movement per side and per bucket of the old probability (toy trainer metrics).

The Band's bounds depend on the old probability :math:`p` of a token: for the KL Band a rare token
(:math:`p \ll \delta`) has a lower bound :math:`l \approx e^{-1-\delta/p} \approx 0` and an upper bound
:math:`u \approx 1/p`, a common one a narrow :math:`[l, u]` around 1.  A fixed clip uses :math:`[1-\varepsilon,
1+\varepsilon]` everywhere.  These metrics show which tokens each method clips, on which side, and how far the
ratio of each kind of token moved after a batch's updates.  All counts are tensor reductions; the metrics of one
step are read back in one host synchronisation.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["MECHANISM_FIELDS", "P_BUCKETS", "bucket_masks", "bucket_metrics", "clipped_by_bucket", "mechanism"]

#: Buckets of the old probability p of a sampled token, p in [lo, hi) (the TRL adapter's edges).
P_BUCKETS = (("p<0.01", 0.0, 0.01), ("p0.01-0.1", 0.01, 0.1), ("p0.1-0.5", 0.1, 0.5), ("p>=0.5", 0.5, float("inf")))


def bucket_masks(old_log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(K, B, T): ``mask`` restricted to each bucket of :data:`P_BUCKETS` of the old probability."""
    old_prob = old_log_prob.exp()
    return torch.stack([mask * ((old_prob >= lo) & (old_prob < hi)) for _, lo, hi in P_BUCKETS])


def clipped_by_bucket(log_ratio: torch.Tensor, advantages: torch.Tensor, log_lower: torch.Tensor,
                      log_upper: torch.Tensor, bucket: torch.Tensor) -> torch.Tensor:
    r"""(2, K) token counts clipped below (:math:`A<0,\ \log r<\log l`) and above (:math:`A>0,\ \log r>\log u`)."""
    adv = advantages[:, None]
    low = ((adv < 0) & (log_ratio < log_lower)).float()
    high = ((adv > 0) & (log_ratio > log_upper)).float()
    return torch.stack([(bucket * low).sum(dim=(1, 2)), (bucket * high).sum(dim=(1, 2))])


def bucket_metrics(bucket: torch.Tensor, side_sums: torch.Tensor, passes: int, final_log_ratio: torch.Tensor,
                   advantages: torch.Tensor) -> dict[str, float]:
    r"""Per bucket :math:`b` of the old probability (one host synchronisation for all of them).

    - ``token_frac/<b>``: share of the batch's completion tokens in :math:`b`;
    - ``clipfrac_low/<b>``, ``clipfrac_high/<b>``: fraction of :math:`b`'s tokens clipped below
      (:math:`A<0,\ r<l`) and above (:math:`A>0,\ r>u`), over the step's ``passes`` (``ppo_epochs``) passes, each of
      which sees every token once;
    - ``final_log_ratio_neg/<b>``, ``final_log_ratio_pos/<b>``: mean :math:`\log r = \log\pi - \log p` after the
      step's last update over :math:`b`'s tokens with :math:`A<0` / :math:`A>0` (how far they were pushed).

    A bucket without tokens (or without tokens of that sign) logs nothing.
    """
    adv = advantages[:, None]
    tokens = bucket.sum(dim=(1, 2))
    neg, pos = bucket * (adv < 0), bucket * (adv > 0)
    rows = torch.stack([tokens, side_sums[0], side_sums[1], neg.sum(dim=(1, 2)), pos.sum(dim=(1, 2)),
                        (neg * final_log_ratio).sum(dim=(1, 2)), (pos * final_log_ratio).sum(dim=(1, 2))])
    tokens, low, high, n_neg, n_pos, sum_neg, sum_pos = rows.tolist()
    total = max(sum(tokens), 1.0)
    out: dict[str, float] = {}
    for k, (name, _, _) in enumerate(P_BUCKETS):
        out[f"token_frac/{name}"] = tokens[k] / total
        if tokens[k] > 0:
            out[f"clipfrac_low/{name}"] = low[k] / (tokens[k] * passes)
            out[f"clipfrac_high/{name}"] = high[k] / (tokens[k] * passes)
        if n_neg[k] > 0:
            out[f"final_log_ratio_neg/{name}"] = sum_neg[k] / n_neg[k]
        if n_pos[k] > 0:
            out[f"final_log_ratio_pos/{name}"] = sum_pos[k] / n_pos[k]
    return out


RARE, COMMON = "p<0.01", "p>=0.5"
#: The run-level numbers of :func:`mechanism` and what they mean.
MECHANISM_FIELDS = {
    "clip_low_rare": "rare tokens (p < 0.01) clipped below",
    "clip_high_rare": "rare tokens clipped above",
    "clip_low_common": "common tokens (p ≥ 0.5) clipped below",
    "clip_high_common": "common tokens clipped above",
    "log_ratio_neg_rare": "log r of rare tokens with A < 0 after a batch",
    "log_ratio_pos_rare": "log r of rare tokens with A > 0 after a batch",
}


def _weighted(steps: list[dict[str, Any]], key: str, bucket: str) -> float | None:
    """Token-weighted mean over the steps of ``key/bucket`` (weights ``token_frac/bucket``); None if never seen."""
    pairs = [(s[f"{key}/{bucket}"], s[f"token_frac/{bucket}"]) for s in steps if f"{key}/{bucket}" in s]
    weight = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / weight if weight > 0 else None


def mechanism(steps: list[dict[str, Any]]) -> dict[str, float | None]:
    r"""A run's rare-token numbers from its metric lines (steps :math:`\ge 1`), :data:`MECHANISM_FIELDS`.

    ``clip_low_rare`` :math:`= \sum_s c_s w_s / \sum_s w_s` with :math:`c_s` the step's ``clipfrac_low/p<0.01``
    and :math:`w_s` its ``token_frac/p<0.01`` (the fraction of all rare tokens of the run clipped below), and so
    on for the other side and for :math:`p \ge 0.5`; ``log_ratio_neg_rare`` / ``log_ratio_pos_rare``: the mean
    over the steps that had such tokens of ``final_log_ratio_neg/p<0.01`` / ``final_log_ratio_pos/p<0.01``.
    ``None`` where no step had such a token.
    """
    def mean_of(key: str) -> float | None:
        values = [s[key] for s in steps if key in s]
        return sum(values) / len(values) if values else None

    return {
        "clip_low_rare": _weighted(steps, "clipfrac_low", RARE),
        "clip_high_rare": _weighted(steps, "clipfrac_high", RARE),
        "clip_low_common": _weighted(steps, "clipfrac_low", COMMON),
        "clip_high_common": _weighted(steps, "clipfrac_high", COMMON),
        "log_ratio_neg_rare": mean_of(f"final_log_ratio_neg/{RARE}"),
        "log_ratio_pos_rare": mean_of(f"final_log_ratio_pos/{RARE}"),
    }
