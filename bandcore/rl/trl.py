r"""BandPO in TRL: a :class:`trl.GRPOTrainer` whose trust region is the Band.

Switching a TRL GRPO run to BandPO is one line each::

    from bandcore.rl.trl import BandGRPOConfig, BandGRPOTrainer
    args = BandGRPOConfig(..., num_iterations=2, band_divergence="kl", band_delta=0.05)
    trainer = BandGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, ...)

How it works (TRL 1.14–1.16, ``trl/trainer/grpo_trainer.py``): TRL's loss reads the plain attributes
``self.epsilon_low`` / ``self.epsilon_high``, and every expression that reads them broadcasts.  For the duration of
one ``_compute_loss`` call, right after TRL has computed the current policy's log-probabilities (the call of
``_get_per_token_logps_and_entropies`` inside it), they become per-token tensors, and TRL computes the loss with
its own code (no copy of it here); afterwards the scalar values are restored.

- ``band_loss_form="clip"`` (``loss_type`` grpo, bnpo, dr_grpo, dapo): TRL's surrogate
  :math:`-\min(r A, \operatorname{clamp}(r, 1-\varepsilon_{low}, 1+\varepsilon_{high}) A)` with
  :math:`\varepsilon_{low} = 1 - l`, :math:`\varepsilon_{high} = u - 1`, so TRL clips at the Band and its
  ``clip_ratio/*`` metrics are the Band's (:math:`1 - (1 - l)` rounds :math:`l` to the dtype's absolute
  precision, about 1e-16 in fp64 and 6e-8 in fp32).  TRL's ``delta`` (two-sided clipping) still applies on top.
- ``band_loss_form="dppo"`` (``loss_type="cispo"``): TRL's truncated-IS surrogate
  :math:`-\operatorname{sg}[\min(r, \varepsilon_{high})]\,A\log\pi` with :math:`\varepsilon_{high} = C`
  (``band_clip_ratio_c``) at the tokens the dppo form keeps and 0 at those it drops, which is
  :func:`bandcore.rl.band_policy_loss` with ``loss_form="dppo"`` (:mod:`bandcore.rl.loss`).

:math:`[l, u]` come from the bounds provider of :class:`bandcore.rl.settings.BandSettings` (the exact solver, or
the shipped 2-D table when the radius moves), at :math:`p = \exp(\texttt{old\_per\_token\_logps})`, or, with
``band_anchor="rollout"``, at the rollout engine's :math:`p_a = \exp(\texttt{sampling\_per\_token\_logps})` (TRL
passes them when it generates with vLLM or a ``rollout_func``; a token whose rollout log-probability vLLM could
not give, NaN, is anchored on the old policy, as TRL's own importance-sampling correction treats it), bounding
:math:`\pi/\pi_a`.  TRL's ``epsilon`` / ``epsilon_high`` no longer clip; they define the fixed clip that the extra
metrics ``band/clip_ratio_fixed/{low,high,region}_mean`` report for comparison (the dppo form: [0.8, 1.2]).

Supported settings: :data:`SUPPORTED_SETTINGS`; every other value of those keys is refused with a ``ValueError``
naming it and the reason in :data:`REFUSED_SETTINGS`.

The schedule's step is TRL's ``state.global_step`` (optimizer steps done).  The controller is told, at the last
micro-batch of each gradient-accumulation window (``accelerator.sync_gradients``, training only), the mean
:math:`r - 1 - \log r` over the window's completion tokens, summed over processes, so every process holds the same
δ.

The ratio moves only when a batch is optimised after an optimizer step that followed its generation.  TRL
(``_generate_and_score_completions``) computes ``old_per_token_logps`` only when ``gradient_accumulation_steps``
is not a multiple of ``steps_per_generation * num_iterations``; otherwise every pass over a batch happens within
the optimizer step that generated it, the ratio is exactly 1 and no bound can act.  :class:`BandGRPOConfig`
therefore defaults to ``num_iterations=2`` and refuses (``ValueError`` naming the three fields) a configuration
where the ratio is always 1 (:meth:`BandSettings.check_on_policy`), unless ``band_allow_on_policy=True`` says that
it is intended or ``band_anchor="rollout"`` anchors the Band elsewhere; a batch that still arrives without
``old_per_token_logps`` is run through TRL's loss unchanged (the dppo form: with the truncation :math:`C`), with
one ``UserWarning`` unless ``band_allow_on_policy`` is set.

Metrics added to TRL's (``self._metrics[mode]``, reduced over processes with one host synchronisation per
step): ``band/delta`` (or ``band/delta_low`` and ``band/delta_high`` when they differ), ``band/clip_ratio/{low,
high,region}`` (fractions of completion tokens the Band clips or drops; under the clip form equal to TRL's
``clip_ratio/*_mean``), ``band/width_mean``, ``band/clip_ratio_fixed/{low,high,region}_mean`` and, per bucket of
the anchor probability :math:`p`, the Band's clipped fraction of the tokens in that bucket:
``band/clip_ratio/p<0.01``, ``band/clip_ratio/p0.01-0.1``, ``band/clip_ratio/p0.1-0.5``,
``band/clip_ratio/p>=0.5`` (a bucket holding no token in a step, over all processes, logs nothing that step).

TRL versions: :data:`SUPPORTED_TRL`; CI runs the TRL tests at both ends (TRL 1.16 with the newest transformers,
and TRL 1.14.0 with transformers 4.56.2, the lowest it accepts).  The trainer overrides exactly two private
methods, ``GRPOTrainer._compute_loss`` and ``_get_per_token_logps_and_entropies`` (tests guard their signatures
and the lines of TRL's loss this relies on); importing this module with a TRL outside ``SUPPORTED_TRL`` raises
``ImportError``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import trl
from packaging.version import InvalidVersion, Version

#: TRL versions this adapter supports, as a pip requirement (the ``rl`` extra pins the same range).
SUPPORTED_TRL = "trl>=1.14,<1.17"
_TRL_RANGE = ((1, 14), (1, 17))


def _check_trl_version(version: str) -> None:
    """Raise ``ImportError`` when TRL ``version`` is outside :data:`SUPPORTED_TRL` (pre-releases of 1.17 too)."""
    try:
        release = Version(version).release
    except InvalidVersion:
        release = None
    if release is None or not _TRL_RANGE[0] <= release < _TRL_RANGE[1]:
        raise ImportError(
            f"bandcore.rl.trl supports {SUPPORTED_TRL} (it overrides private GRPOTrainer methods), but trl "
            f"{version} is installed; install a supported version, e.g. pip install '{SUPPORTED_TRL}'"
        )


_check_trl_version(trl.__version__)

from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from .bounds import FIXED_CLIP  # noqa: E402
from .settings import DEFAULT_DELTA_RANGE, DEFAULT_KL_RATE, BandSettings  # noqa: E402

__all__ = ["LOSS_FORM_OF", "P_BUCKETS", "REFUSED_SETTINGS", "SUPPORTED_LOSS_TYPES", "SUPPORTED_SETTINGS",
           "SUPPORTED_TRL", "BandGRPOConfig", "BandGRPOTrainer"]

_CLAMP = "TRL's two-sided clamp at the Band's per-token bounds (band_loss_form='clip')"
#: The TRL settings the plug-in runs: (TRL key, value) -> how the Band enters.
SUPPORTED_SETTINGS = {
    ("importance_sampling_level", "token"): "one ratio per token, bounded by the Band of that token's probability",
    ("loss_type", "grpo"): _CLAMP,
    ("loss_type", "bnpo"): _CLAMP,
    ("loss_type", "dr_grpo"): _CLAMP,
    ("loss_type", "dapo"): _CLAMP,
    ("loss_type", "cispo"): "TRL's truncated-IS surrogate, truncated at C inside the Band and at 0 outside it "
                            "(band_loss_form='dppo')",
    ("use_liger_kernel", False): "TRL's own loss code, which reads the per-token bounds",
}
#: Every other value of those keys is refused, with this reason (a value in neither table: unknown to the plug-in).
REFUSED_SETTINGS = {
    ("importance_sampling_level", "sequence"): "one ratio per sequence has no per-token probability for the Band",
    ("loss_type", "sapo"): "SAPO gates the ratio with a smooth sigmoid, not a clamp the Band could replace",
    ("loss_type", "vespo"): "VESPO weights whole sequences by their summed log-ratio, with no per-token clamp",
    ("loss_type", "luspo"): "LUSPO is built for sequence-level importance sampling (one ratio per sequence)",
    ("use_liger_kernel", True): "Liger's fused GRPO loss computes its own clip, out of the Band's reach",
}
#: The band_loss_form each supported TRL loss_type runs.
LOSS_FORM_OF = {"grpo": "clip", "bnpo": "clip", "dr_grpo": "clip", "dapo": "clip", "cispo": "dppo"}
#: TRL loss types whose surrogate is the two-sided clamp that the Band replaces.
SUPPORTED_LOSS_TYPES = tuple(t for t, form in LOSS_FORM_OF.items() if form == "clip")
#: Old-probability buckets of the ``band/clip_ratio/<bucket>`` metrics: (name, lower edge, upper edge), p in [lo, hi).
P_BUCKETS = (("p<0.01", 0.0, 0.01), ("p0.01-0.1", 0.01, 0.1), ("p0.1-0.5", 0.1, 0.5), ("p>=0.5", 0.5, math.inf))
#: BandSettings fields read from TRL's own keys (the rest: ``band_<field>``).
HOST_KEYS = {"clip_eps": "epsilon", "clip_eps_high": "epsilon_high"}

_ON_POLICY_WARNING = (
    "BandGRPOTrainer: this batch has no old_per_token_logps (fully on-policy training: num_iterations == 1 and "
    "generation aligned with gradient accumulation), so the ratio is exactly 1 and the Band never clips. Set "
    "num_iterations >= 2 (or steps_per_generation > gradient_accumulation_steps) for the Band to act."
)


def ratio_is_always_one(args: GRPOConfig) -> bool:
    """True when TRL never computes ``old_per_token_logps`` for a fresh batch, so that its ratio is exactly 1.

    TRL's rule (``_generate_and_score_completions``): generation happens every ``steps_per_generation *
    num_iterations`` micro-steps, and when that divides ``gradient_accumulation_steps`` every pass over a batch
    lies within the optimizer step that generated it (with vLLM TRL computes the old log-probabilities anyway,
    but with the same weights, so the ratio is 1 there too).
    """
    generate_every = args.steps_per_generation * args.num_iterations
    return args.gradient_accumulation_steps % generate_every == 0


def band_settings(args: GRPOConfig) -> BandSettings:
    """The :class:`BandSettings` of a :class:`BandGRPOConfig`: its ``band_*`` fields, TRL's ``epsilon`` /
    ``epsilon_high`` as the fixed clip (``band_method="clip"``); TRL has no dual clip (its ``delta`` applies
    on top)."""
    return BandSettings.from_host(args, prefix="band_", names=HOST_KEYS, dual_clip=None)


def _check_band_settings(args: GRPOConfig) -> BandSettings:
    """The settings, after refusing (``ValueError`` naming the key) every TRL setting the Band route does not run."""
    settings = band_settings(args)
    for key in ("importance_sampling_level", "loss_type", "use_liger_kernel"):
        value = getattr(args, key)
        if (key, value) not in SUPPORTED_SETTINGS:
            allowed = tuple(v for k, v in SUPPORTED_SETTINGS if k == key)
            reason = REFUSED_SETTINGS.get((key, value), "a value this plug-in does not know")
            raise ValueError(f"{key} must be one of {allowed} for BandGRPOTrainer, got {value!r} ({reason})")
    form = LOSS_FORM_OF[args.loss_type]
    if settings.loss_form != form:
        types = tuple(t for t, f in LOSS_FORM_OF.items() if f == settings.loss_form)
        raise ValueError(f"band_loss_form={settings.loss_form!r} runs through TRL's loss_type in {types}, got "
                         f"loss_type={args.loss_type!r} (which runs band_loss_form={form!r})")
    settings.check_on_policy(
        ratio_is_always_one(args),
        f"num_iterations={args.num_iterations}, steps_per_generation={args.steps_per_generation}, "
        f"gradient_accumulation_steps={args.gradient_accumulation_steps} (gradient_accumulation_steps is a multiple "
        "of steps_per_generation * num_iterations, so every batch is used within the optimizer step that generated "
        "it; e.g. num_iterations=2 with steps_per_generation = gradient_accumulation_steps, the default, moves it)",
    )
    return settings


def _band_field(default: Any, text: str) -> Any:
    return field(default=default, metadata={"help": text})


@dataclass
class BandGRPOConfig(GRPOConfig):
    r"""A :class:`trl.GRPOConfig` with the Band's hyperparameters.

    Each ``band_<name>`` is the field ``<name>`` of :class:`bandcore.rl.settings.BandSettings` (its docstring
    says what each means and allows); they are checked when the config is built and again by the trainer.
    ``band_divergence`` (``"kl"``: :math:`KL(\pi_{old}\|\pi)`, BandPO's choice), ``band_delta`` (default 0.05
    when no side is given), ``band_delta_low`` / ``band_delta_high``, ``band_max_ratio`` (the BandPO runs used
    10), ``band_method`` (``"clip"`` / ``"clip-higher"``: TRL's ``epsilon`` / ``epsilon_high`` through the same
    code), ``band_loss_form`` (``"clip"``; ``"dppo"`` with ``loss_type="cispo"``), ``band_clip_ratio_c`` (the
    dppo form's :math:`C`, default 20), ``band_delta_schedule`` with ``band_delta_end``, ``band_delta_steps``,
    ``band_delta_hold_steps``, ``band_target_kl`` with ``band_kl_rate``, ``band_delta_min``,
    ``band_delta_max``, ``band_anchor`` (``"old"`` or ``"rollout"``) and ``band_allow_on_policy``.

    ``num_iterations`` defaults to 2 here (TRL: 1): each generated batch is optimised twice, so from the second
    pass on the ratio differs from 1 and the Band acts.  With TRL's ``num_iterations=1`` and
    ``steps_per_generation`` equal to ``gradient_accumulation_steps`` (TRL's default), or in general whenever
    ``gradient_accumulation_steps`` is a multiple of ``steps_per_generation * num_iterations``, the ratio is
    exactly 1 and the configuration is refused unless ``band_allow_on_policy=True``.

    ``band_settings`` (set after validation) holds the :class:`BandSettings`.  See :mod:`bandcore.rl.trl` for the
    supported TRL settings.
    """

    band_divergence: str = _band_field("kl", "f-divergence of the Band's trust region (name, alias, alpha(a), "
                                              "a formula in u, renyi(a), ...).")
    band_delta: float | None = _band_field(None, "Radius δ > 0 of both sides (default 0.05).")
    band_delta_low: float | None = _band_field(None, "Radius of the lower bound (default band_delta).")
    band_delta_high: float | None = _band_field(None, "Radius of the upper bound (default band_delta).")
    band_max_ratio: float | None = _band_field(None, "Optional cap (> 1) on the Band's upper ratio bound.")
    band_method: str = _band_field("band", "band, or clip / clip-higher (TRL's epsilon) for baselines.")
    band_loss_form: str = _band_field("clip", "clip (PPO clip at the Band) or dppo (DPPO's masked truncated IS; "
                                              "loss_type='cispo').")
    band_clip_ratio_c: float | None = _band_field(None, "Truncation C > 1 of the dppo form (default 20).")
    band_delta_schedule: str = _band_field("constant", "constant, linear, cosine or exponential.")
    band_delta_end: float | None = _band_field(None, "Final radius of a schedule.")
    band_delta_steps: int | None = _band_field(None, "Optimizer steps a schedule takes from band_delta to "
                                                     "band_delta_end.")
    band_delta_hold_steps: int = _band_field(0, "Optimizer steps at band_delta before a schedule starts.")
    band_target_kl: float | None = _band_field(None, "Target KL(pi_old || pi) of the adaptive radius.")
    band_kl_rate: float = _band_field(DEFAULT_KL_RATE, "Rate η in (0, 1] of the adaptive radius.")
    band_delta_min: float = _band_field(DEFAULT_DELTA_RANGE[0], "Smallest radius of the adaptive radius.")
    band_delta_max: float = _band_field(DEFAULT_DELTA_RANGE[1], "Largest radius of the adaptive radius.")
    band_anchor: str = _band_field("old", "old, or rollout (the Band of the rollout engine's probabilities).")
    band_allow_on_policy: bool = _band_field(False, "Accept a configuration where the ratio is always 1 (the Band "
                                                    "then never acts).")
    num_iterations: int = _band_field(2, "Optimisation passes per generated batch (μ); 2 by default so that the "
                                         "Band acts.")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.band_divergence, str):
            raise TypeError(
                f"band_divergence must be a divergence name or alias (str), got {self.band_divergence!r}"
            )
        self.band_settings = _check_band_settings(self)


class BandGRPOTrainer(GRPOTrainer):
    """:class:`trl.GRPOTrainer` with the Band as its trust region; takes the arguments of ``GRPOTrainer``.

    ``args`` must be a :class:`BandGRPOConfig`.  The loss, its aggregation (``loss_type``), the KL penalty,
    entropy bonus and TRL's metrics are TRL's own; only the per-token bounds change.
    """

    def __init__(self, *pargs: Any, **kwargs: Any) -> None:
        args = kwargs.get("args", pargs[2] if len(pargs) > 2 else None)
        if not isinstance(args, BandGRPOConfig):
            raise TypeError(f"args must be a BandGRPOConfig, got {type(args).__name__}")
        args.band_settings = _check_band_settings(args)  # fields may have been changed after the config was built
        super().__init__(*pargs, **kwargs)
        self.band_bounds = args.band_settings.bounds_provider()
        self._band_inputs: dict[str, Any] | None = None
        self._band_state: dict[str, Any] | None = None
        self._band_warned_on_policy = False
        self._band_window = [0.0, 0.0]  # the controller's KL sum and token count over the accumulation window

    def band_ratio_bounds(self, old_log_prob: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The Band's ratio bounds ``(l, u)`` at log-probabilities, with this trainer's settings and current δ."""
        log_lower, log_upper = self.band_bounds.log_bounds(old_log_prob.detach())
        return torch.exp(log_lower), torch.exp(log_upper)

    def _get_per_token_logps_and_entropies(self, *pargs: Any, **kwargs: Any):
        out = super()._get_per_token_logps_and_entropies(*pargs, **kwargs)
        if self._band_inputs is not None:  # only the call made by _compute_loss: the current policy's log π
            inputs, self._band_inputs = self._band_inputs, None
            self._band_set_epsilons(inputs, out[0].detach())
        return out

    def _band_set_epsilons(self, inputs: dict[str, Any], log_prob: torch.Tensor) -> None:
        """Per-token epsilons of the Band for this micro-batch (module docstring), kept for the metrics."""
        settings = self.args.band_settings
        old = inputs.get("old_per_token_logps")
        old = log_prob if old is None else old  # TRL's own rule (on-policy: the current log-probabilities)
        mask = inputs["completion_mask"] != 0
        anchor = None
        if settings.anchor == "rollout":
            rollout = inputs["sampling_per_token_logps"]
            anchor = torch.where(torch.isnan(rollout), old, rollout)
        base = torch.where(mask, old if anchor is None else anchor, 0.0)  # padding may hold anything
        log_lower, log_upper = self.band_bounds.log_bounds(base)
        shift = 0.0 if anchor is None else torch.where(mask, anchor - old, 0.0)
        ratio_lower, ratio_upper = log_lower + shift, log_upper + shift
        state = {"log_prob": log_prob, "old": old, "base": base, "log_lower": log_lower, "log_upper": log_upper}
        if settings.loss_form == "clip":
            self.epsilon_low, self.epsilon_high = 1.0 - torch.exp(ratio_lower), torch.exp(ratio_upper) - 1.0
        else:
            advantages = inputs["advantages"]
            advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
            log_ratio = log_prob - old
            keep_up = log_ratio <= torch.maximum(ratio_upper, torch.as_tensor(shift, dtype=log_ratio.dtype))
            keep_down = log_ratio >= torch.minimum(ratio_lower, torch.as_tensor(shift, dtype=log_ratio.dtype))
            keep = torch.where(advantages > 0, keep_up, keep_down)
            self.epsilon_high = torch.where(keep, settings.truncation, 0.0).to(log_prob.dtype)
            state.update(keep_up=keep_up, keep_down=keep_down)
        state.update(epsilon_low=self.epsilon_low, epsilon_high=self.epsilon_high)
        self._band_state = state

    def _compute_loss(self, model, inputs):
        settings = self.args.band_settings
        self.band_bounds.set_step(self.state.global_step)
        if settings.anchor == "rollout" and inputs.get("sampling_per_token_logps") is None:
            raise ValueError(
                "band_anchor='rollout' needs the rollout engine's log-probabilities, which TRL passes as "
                "inputs['sampling_per_token_logps'] only when it generates with vLLM (use_vllm=True) or with a "
                "rollout_func that returns logprobs; this batch has no sampling_per_token_logps"
            )
        saved = (self.epsilon_low, self.epsilon_high)
        if inputs.get("old_per_token_logps") is None and settings.anchor == "old":
            if not (self._band_warned_on_policy or settings.allow_on_policy):
                self._band_warned_on_policy = True
                warnings.warn(_ON_POLICY_WARNING, UserWarning, stacklevel=2)
            if settings.loss_form == "clip":
                return super()._compute_loss(model, inputs)  # r = 1: inside every bound, TRL's loss as it is
            self.epsilon_high = settings.truncation  # r = 1 keeps every token: the dppo form's weight min(1, C)
            try:
                return super()._compute_loss(model, inputs)
            finally:
                self.epsilon_low, self.epsilon_high = saved
        self._band_inputs = inputs
        try:
            loss = super()._compute_loss(model, inputs)
            state = self._band_state
        finally:
            self.epsilon_low, self.epsilon_high = saved
            self._band_inputs = self._band_state = None
        if state is None:
            raise RuntimeError("TRL's _compute_loss did not call _get_per_token_logps_and_entropies, so the Band's "
                               f"bounds were not applied; this TRL ({trl.__version__}) is not supported")
        self._log_band_metrics(inputs, state)
        return loss

    def _log_band_metrics(self, inputs: dict[str, Any], state: dict[str, Any]) -> None:
        """The Band's clip fractions (overall and per anchor-probability bucket), its width, the fixed clip's
        fractions, δ and the controller's KL, reduced over processes in one call (one host synchronisation)."""
        settings = self.args.band_settings
        log_lower, log_upper = state["log_lower"], state["log_upper"]
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        mask = mask.to(log_upper.dtype)
        advantages = inputs["advantages"]
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(1)
        log_ratio = state["log_prob"] - state["old"]
        ratio = torch.exp(log_ratio)
        if settings.loss_form == "clip":  # the Band's clips, as TRL's clip metrics compare them (same rounding)
            band_low = (ratio < 1 - state["epsilon_low"]) & (advantages < 0)
            band_high = (ratio > 1 + state["epsilon_high"]) & (advantages > 0)
            fixed_low, fixed_high = self.epsilon_low, self.epsilon_high
        else:
            band_low = ~state["keep_down"] & (advantages < 0)
            band_high = ~state["keep_up"] & (advantages > 0)
            fixed_low, fixed_high = 1 - FIXED_CLIP[0], FIXED_CLIP[1] - 1
        band_region = band_low | band_high
        low = (ratio < 1 - fixed_low) & (advantages < 0)
        high = (ratio > 1 + fixed_high) & (advantages > 0)
        counted = mask * torch.isfinite(log_ratio)
        k3 = torch.where(counted != 0, torch.expm1(log_ratio) - log_ratio, 0.0)
        prob = torch.exp(state["base"])
        sums = [(torch.exp(log_upper) - torch.exp(log_lower)) * mask, band_low * mask, band_high * mask,
                band_region * mask, low * mask, high * mask, (low | high) * mask, k3 * counted, counted]
        for _, lo, hi in P_BUCKETS:
            in_bucket = mask * ((prob >= lo) & (prob < hi))
            sums += [band_region * in_bucket, in_bucket]
        sums.append(mask)
        totals = self.accelerator.reduce(torch.stack([x.sum() for x in sums]), reduction="sum").tolist()
        count = max(totals[-1], 1.0)
        mode = "train" if self.model.training else "eval"
        names = ("band/width_mean", "band/clip_ratio/low", "band/clip_ratio/high", "band/clip_ratio/region",
                 "band/clip_ratio_fixed/low_mean", "band/clip_ratio_fixed/high_mean",
                 "band/clip_ratio_fixed/region_mean")
        for name, total in zip(names, totals, strict=False):
            self._metrics[mode][name].append(total / count)
        for name, value in self.band_bounds.metrics().items():
            self._metrics[mode][f"band/{name}"].append(value)
        kl_sum, kl_tokens = totals[len(names)], totals[len(names) + 1]
        buckets = totals[len(names) + 2:-1]
        for (name, _, _), clipped, tokens in zip(P_BUCKETS, buckets[0::2], buckets[1::2], strict=True):
            if tokens > 0:  # an empty bucket logs nothing (TRL averages each key's list over the logging window)
                self._metrics[mode][f"band/clip_ratio/{name}"].append(clipped / tokens)
        if settings.target_kl is not None and mode == "train":
            self._band_window[0] += kl_sum
            self._band_window[1] += kl_tokens
            if self.accelerator.sync_gradients:  # the last micro-batch of the optimizer step
                window, self._band_window = self._band_window, [0.0, 0.0]
                if window[1] > 0:
                    self.band_bounds.record_kl(window[0] / window[1])
