r"""The toy trainer's configuration: one dataclass, the single source of every setting's name, default and help.

Each field of :class:`TrainConfig` carries its documentation and its constraint in ``field(metadata=...)``
(:func:`option`): ``help``, the CLI ``group``, and ``choices`` or a range (``minimum``/``maximum`` inclusive,
``above``/``below`` exclusive).  :meth:`TrainConfig.validate` (run by the constructor) checks every field against
that declaration, then the relations between fields, the loss settings (with the loss's own checks), the
divergence (:func:`bandcore.divergences.get_divergence`), the model directory and the device, so a bad setting
is reported, by name, before any work.  ``bandcore train`` generates its options from the same fields.

This module imports torch (no ``transformers``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bandcore.rl.bounds import METHODS, check_bound_settings, check_divergence
from bandcore.rl.loss import LOSS_AGG_MODES

from .model import MODEL_SIZES
from .tasks import REWARDS, TASKS, Task, get_task

__all__ = ["FIELD_TYPES", "TrainConfig", "field_type", "option"]


def option(default: Any, help: str, *, group: str, choices: tuple[str, ...] | None = None,
           minimum: float | None = None, maximum: float | None = None, above: float | None = None,
           below: float | None = None, label: str | None = None) -> Any:
    """A dataclass field whose metadata declares its help text, CLI group and constraint."""
    metadata = {"help": help, "group": group, "choices": choices, "minimum": minimum, "maximum": maximum,
                "above": above, "below": below, "label": label}
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a run (saved in the checkpoint and checked on ``--resume``)."""

    # task
    task: str = option("reverse", "verifiable task: 'reverse' (write a digit string backwards; the warm-up habit "
                       "copies it) or 'add' (a sum, least significant digit first; the habit forgets carries)",
                       group="task", choices=tuple(TASKS), label="task")
    reward: str = option("exact", "'exact' (1 for the exact answer, else 0) or 'digits' (fraction of the answer "
                         "positions that are right)", group="task", choices=REWARDS)
    digits: int = option(4, "problem size: digits per operand (add, 1-8) or string length (reverse, 2-16)",
                         group="task", minimum=1)
    base: int = option(10, "number base of the digits", group="task", minimum=2, maximum=10)
    demo_correct: float = option(0.1, "fraction of correct demonstrations in the warm-up's habit phase",
                                 group="task", minimum=0.0, maximum=1.0)
    demo_noise: float = option(0.05, "fraction of warm-up demonstrations with one random mistake",
                               group="task", minimum=0.0, maximum=1.0)
    # policy
    model: str | None = option(None, "local Hugging Face model directory; none: build a Llama of --size",
                               group="policy")
    size: str = option("tiny", "size of the built Llama", group="policy", choices=tuple(MODEL_SIZES),
                       label="model size")
    # loss
    method: str = option("band", "ratio bounds: 'band' (the Band of the old probability), 'clip' "
                         "([1-eps, 1+eps]) or 'clip-higher' ([1-eps, 1+eps_high])", group="loss", choices=METHODS)
    divergence: str = option("kl", "the Band's f-divergence: a name, an alias, alpha(a) or a formula in u",
                             group="loss")
    delta: float = option(0.05, "radius δ of the Band's trust region", group="loss", above=0.0)
    clip_eps: float = option(0.2, "clip ε of 'clip' and 'clip-higher'", group="loss", above=0.0, below=1.0)
    clip_eps_high: float | None = option(None, "upper ε_high of the fixed clips; none: ε for 'clip', 0.28 "
                                         "for 'clip-higher'", group="loss", above=0.0)
    dual_clip: float | None = option(None, "dual-clip constant c > 1 (loss capped at -A c where A < 0); none: off",
                                     group="loss", above=1.0)
    max_ratio: float | None = option(None, "cap (> 1) on the upper ratio bound; none: no cap", group="loss", above=1.0)
    min_ratio: float | None = option(None, "floor (< 1) on the lower ratio bound, applied to the Band's (or the "
                                     "clip's) lower bound, e.g. 0.8: the Band's upper bound with the fixed clip's "
                                     "lower bound; none: no floor", group="loss", above=0.0, below=1.0)
    loss_agg_mode: str = option("token-mean", "aggregation of the per-token loss", group="loss",
                                choices=LOSS_AGG_MODES)
    # RL loop
    steps: int = option(60, "RL steps (the length of the whole run)", group="RL loop", minimum=1)
    prompts_per_step: int = option(8, "prompts per RL step", group="RL loop", minimum=1)
    group_size: int = option(8, "completions per prompt (GRPO compares them)", group="RL loop", minimum=2)
    ppo_epochs: int = option(4, "optimisation passes over each batch", group="RL loop", minimum=1)
    minibatches: int = option(2, "minibatches per pass (must divide prompts_per_step * group_size)",
                              group="RL loop", minimum=1)
    lr: float = option(3e-4, "Adam learning rate of the RL updates", group="RL loop", above=0.0)
    max_grad_norm: float = option(1.0, "gradient-norm clip of the RL updates", group="RL loop", above=0.0)
    temperature: float = option(1.0, "sampling temperature τ (the old log-probs are those of softmax(z/τ))",
                                group="RL loop", above=0.0)
    # supervised warm-up: skills (half the demonstrations correct), then the habit (demo_correct of them)
    warmup_steps: int = option(150, "warm-up steps of the skill phase (half the demonstrations correct)",
                               group="warm-up", minimum=0)
    habit_steps: int = option(100, "warm-up steps of the habit phase (demo_correct of them correct)",
                              group="warm-up", minimum=0)
    warmup_batch: int = option(64, "warm-up batch size", group="warm-up", minimum=1)
    warmup_lr: float = option(3e-3, "warm-up learning rate (AdamW)", group="warm-up", above=0.0)
    # evaluation (fixed prompts, the same for every seed and method)
    eval_prompts: int = option(64, "evaluation prompts (a fixed set)", group="evaluation", minimum=1)
    eval_k: int = option(8, "samples per evaluation prompt (pass@k)", group="evaluation", minimum=1)
    eval_every: int = option(0, "evaluate every N steps (0: only at the end)", group="evaluation", minimum=0)
    # bookkeeping
    seed: int = option(0, "random seed", group="bookkeeping", minimum=0)
    device: str = option("cpu", "torch device, e.g. cpu or cuda", group="bookkeeping")
    save_every: int = option(20, "checkpoint every N steps (0: only at the end)", group="bookkeeping", minimum=0)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` / ``TypeError`` naming the first bad field (``"<field>: ..."``)."""
        for field in dataclasses.fields(self):
            _check_field(field, getattr(self, field.name))
        batch = self.prompts_per_step * self.group_size
        if batch % self.minibatches:
            raise ValueError(
                f"minibatches: must divide the batch prompts_per_step*group_size = {batch}, got {self.minibatches!r}"
            )
        low, high = TASKS[self.task].size_range
        if not low <= self.digits <= high:
            raise ValueError(f"digits: must be in [{low}, {high}] for task {self.task!r}, got {self.digits!r}")
        if self.demo_correct + self.demo_noise > 1.0:
            raise ValueError(f"demo_correct + demo_noise: must be <= 1, got {self.demo_correct!r} + "
                             f"{self.demo_noise!r}")
        try:
            _check_divergence(self.divergence)
        except (ValueError, TypeError) as err:
            raise (TypeError if isinstance(err, TypeError) else ValueError)(f"divergence: {err}") from None
        # the loss's own checks (their messages name the setting), e.g. delta above the Band's maximum
        check_bound_settings(method=self.method, divergence=self.divergence, delta=self.delta,
                             max_ratio=self.max_ratio, clip_eps=self.clip_eps, clip_eps_high=self.clip_eps_high)
        if self.model is not None and not Path(self.model).is_dir():
            raise ValueError(f"model: {self.model!r} is not a local directory with a model and tokenizer")
        _check_device(self.device)

    def make_task(self) -> Task:
        """The task of this configuration."""
        return get_task(self.task, reward_mode=self.reward, base=self.base, demo_correct=self.demo_correct,
                        demo_noise=self.demo_noise, **{TASKS[self.task].size_name: self.digits})

    def loss_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`bandcore.rl.band_policy_loss`."""
        return {"method": self.method, "divergence": self.divergence, "delta": self.delta,
                "clip_eps": self.clip_eps, "clip_eps_high": self.clip_eps_high, "dual_clip": self.dual_clip,
                "max_ratio": self.max_ratio, "loss_agg_mode": self.loss_agg_mode}

    def bounds_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`bandcore.rl.bounds.log_ratio_bounds`."""
        return {"method": self.method, "divergence": self.divergence, "delta": self.delta,
                "max_ratio": self.max_ratio, "clip_eps": self.clip_eps, "clip_eps_high": self.clip_eps_high}

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


def _check_divergence(divergence: Any) -> None:
    if not isinstance(divergence, str):
        raise TypeError(f"must be a divergence spelling (str), got {divergence!r}")
    check_divergence(divergence)  # the one grammar: name, alias, alpha(a), formula in u; raises naming it


def _check_device(device: Any) -> None:
    import torch

    if not isinstance(device, str):
        raise TypeError(f"device: must be a torch device string such as 'cpu' or 'cuda', got {device!r}")
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError) as err:
        raise ValueError(f"device: {device!r} is not a torch device ({err})") from None
    backend = getattr(torch, parsed.type, None)
    if parsed.type != "cpu" and hasattr(backend, "is_available"):
        if not backend.is_available():
            raise ValueError(f"device: {device!r} is not available on this machine (torch.{parsed.type}."
                             "is_available() is False)")
        count = getattr(backend, "device_count", lambda: None)()
        if parsed.index is not None and count is not None and parsed.index >= count:
            raise ValueError(f"device: {device!r} does not exist ({count} {parsed.type} device(s))")


def field_type(field: dataclasses.Field) -> tuple[type, bool]:
    """``(base type, accepts None)`` of a :class:`TrainConfig` field, from its annotation."""
    return FIELD_TYPES[field.name]


def _resolve_types() -> dict[str, tuple[type, bool]]:
    out = {}
    for name, hint in typing.get_type_hints(TrainConfig).items():
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(hint))
        out[name] = (args[0] if nullable else hint, nullable)
    return out


def _check_field(field: dataclasses.Field, value: Any) -> None:
    kind, nullable = FIELD_TYPES[field.name]
    meta, name = field.metadata, field.name
    if value is None:
        if nullable:
            return
        raise TypeError(f"{name}: must be given (not None)")
    if kind is bool:
        if not isinstance(value, bool):
            raise TypeError(f"{name}: must be True or False, got {value!r}")
        return
    if kind is str:
        if not isinstance(value, str):
            raise TypeError(f"{name}: must be a string, got {value!r} ({type(value).__name__})")
        if meta["choices"] is not None and value not in meta["choices"]:
            label = meta["label"] or name
            raise ValueError(f"{name}: unknown {label} {value!r}; choose one of {sorted(meta['choices'])}")
        return
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name}: must be an integer, got {value!r} ({type(value).__name__})")
        low, high = meta["minimum"], meta["maximum"]
        if low is not None and high is not None and not low <= value <= high:
            raise ValueError(f"{name}: must be an integer in [{low}, {high}], got {value!r}")
        if low is not None and value < low:
            what = {0: "a non-negative integer", 1: "a positive integer"}.get(low, f"an integer >= {low}")
            raise ValueError(f"{name}: must be {what}, got {value!r}")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: must be a real number, got {value!r} ({type(value).__name__})")
    _check_range(name, float(value), meta)


def _check_range(name: str, value: float, meta: Any) -> None:
    above, below, low, high = meta["above"], meta["below"], meta["minimum"], meta["maximum"]
    if not math.isfinite(value):
        raise ValueError(f"{name}: must be a finite number, got {value!r}")
    if below is not None and not above < value < below:
        raise ValueError(f"{name}: must be a finite number in ({above:g}, {below:g}), got {value!r}")
    if above is not None and not value > above:
        raise ValueError(f"{name}: must be a finite number > {above:g}, got {value!r}")
    high = math.inf if high is None else high
    if low is not None and not low <= value <= high:
        raise ValueError(f"{name}: must be a number in [{low:g}, {high:g}], got {value!r}")


#: name -> (base type, accepts None), resolved once from the annotations
FIELD_TYPES: dict[str, tuple[type, bool]] = _resolve_types()
