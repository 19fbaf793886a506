r"""``bandcore train``: a small GRPO / BandPO loop in torch that reads top to bottom.

One run: seed → build (or load) the policy → supervised warm-up (so the right strategy starts rare) →
for each step: rollout (groups of completions per prompt) → verifiable rewards → group-normalised advantages →
old log-probs under the sampling distribution → ``ppo_epochs`` passes of ``minibatches`` optimiser steps with
:func:`bandcore.rl.band_policy_loss` → one line of ``metrics.jsonl``.

GRPO advantages: for the :math:`G` completions :math:`o_1..o_G` of one prompt with rewards :math:`R_i`,

.. math::  A_i = \frac{R_i - \operatorname{mean}(R)}{\operatorname{std}(R) + 10^{-6}},

the same for every token of :math:`o_i`.  The old log-probs are :math:`\log\pi_{old}(o_t)` of the sampling
distribution :math:`\operatorname{softmax}(z/\tau)` (temperature :math:`\tau`), recomputed by one forward pass
of the frozen policy, so the first optimiser step sees a ratio of exactly 1 and later ones see it move.

Reproducibility: all randomness comes from two ``torch.Generator`` objects (prompts/minibatch order on the
CPU, token sampling on the device) whose states are checkpointed with the model and optimiser, so a run
stopped with ``--max-steps`` and continued with ``--resume`` writes the same metric lines as an uninterrupted
run (the wall-clock fields ``time_*`` and ``band_cost_frac`` excepted).  Checkpoints hold state dicts and
tensors only and are read with ``torch.load(..., weights_only=True)``.

The Band's cost: the bounds depend only on the old log-probs, so each step computes them once for the whole
batch (:func:`bandcore.rl.loss.log_ratio_bounds`) and hands each minibatch its slice; for ``method="band"``
that call is timed and ``band_cost_frac`` = its time / the step's time is logged.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .loss import band_policy_loss, log_ratio_bounds
from .model import MODEL_SIZES, Policy, build_tiny_policy, load_policy
from .tasks import EOS, TASKS, Task, get_task

__all__ = ["METHOD_PRESETS", "TrainConfig", "evaluate", "register_cli", "run", "warm_up"]

#: The three methods of the toy reproduction: name -> loss keyword arguments.
METHOD_PRESETS: dict[str, dict[str, Any]] = {
    "clip": {"method": "clip", "clip_eps": 0.2},
    "clip-higher": {"method": "clip-higher", "clip_eps": 0.2, "clip_eps_high": 0.28},
    "band-kl": {"method": "band", "divergence": "kl", "delta": 0.05},
}

METRICS_FILE = "metrics.jsonl"
CHECKPOINT_FILE = "checkpoint.pt"
WARMUP_FILE = "warmup.pt"
#: Fields of a metrics line that measure wall-clock time and so differ between two identical runs.
TIMING_FIELDS = ("time_step_s", "time_total_s", "band_cost_frac", "time_band_s")


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a run (saved in the checkpoint and checked on ``--resume``)."""

    # task
    task: str = "reverse"
    reward: str = "exact"
    digits: int = 4
    base: int = 10
    demo_correct: float = 0.1
    demo_noise: float = 0.05
    # policy
    model: str | None = None
    size: str = "tiny"
    # loss
    method: str = "band"
    divergence: str = "kl"
    delta: float = 0.05
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    dual_clip: float | None = None
    max_ratio: float | None = None
    loss_agg_mode: str = "token-mean"
    # RL loop
    steps: int = 60
    prompts_per_step: int = 8
    group_size: int = 8
    ppo_epochs: int = 4
    minibatches: int = 2
    lr: float = 3e-4
    max_grad_norm: float = 1.0
    temperature: float = 1.0
    # supervised warm-up: skills (half the demonstrations correct), then the habit (demo_correct of them)
    warmup_steps: int = 150
    habit_steps: int = 100
    warmup_batch: int = 64
    warmup_lr: float = 3e-3
    # evaluation (fixed prompts, the same for every seed and method)
    eval_prompts: int = 64
    eval_k: int = 8
    eval_every: int = 0
    # bookkeeping
    seed: int = 0
    device: str = "cpu"
    save_every: int = 20

    def __post_init__(self) -> None:
        positive = ("digits", "base", "steps", "prompts_per_step", "ppo_epochs", "minibatches", "warmup_batch",
                    "eval_prompts", "eval_k")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        for name in ("warmup_steps", "habit_steps", "eval_every", "save_every", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: must be a non-negative integer, got {value!r}")
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 2:
            raise ValueError(f"group_size: must be an integer >= 2 (GRPO compares), got {self.group_size!r}")
        batch = self.prompts_per_step * self.group_size
        if batch % self.minibatches:
            raise ValueError(
                f"minibatches: must divide the batch prompts_per_step*group_size = {batch}, got {self.minibatches!r}"
            )
        for name in ("lr", "warmup_lr", "temperature", "max_grad_norm"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")
        if self.task not in TASKS:
            raise ValueError(f"task: unknown task {self.task!r}; choose one of {sorted(TASKS)}")
        if self.model is None and self.size not in MODEL_SIZES:
            raise ValueError(f"size: unknown model size {self.size!r}; choose one of {sorted(MODEL_SIZES)}")

    def make_task(self) -> Task:
        size = {"add": "n_digits", "reverse": "length"}[self.task]
        return get_task(self.task, reward_mode=self.reward, base=self.base, demo_correct=self.demo_correct,
                        demo_noise=self.demo_noise, **{size: self.digits})

    def loss_kwargs(self) -> dict[str, Any]:
        return {"method": self.method, "divergence": self.divergence, "delta": self.delta,
                "clip_eps": self.clip_eps, "clip_eps_high": self.clip_eps_high, "dual_clip": self.dual_clip,
                "max_ratio": self.max_ratio, "loss_agg_mode": self.loss_agg_mode}

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


# --------------------------------------------------------------------------------------------------------
# Rollout pieces: sampling, log-probs, masks, advantages
# --------------------------------------------------------------------------------------------------------


@torch.no_grad()
def sample(policy: Policy, prompts: torch.Tensor, max_new_tokens: int, temperature: float,
           generator: torch.Generator) -> torch.Tensor:
    """Sample completions (B, max_new_tokens) in *model* ids from prompts (B, P) in model ids.

    Always generates ``max_new_tokens`` tokens (no early stop, so no host synchronisation); tokens after the
    first ``<eos>`` are masked out later.  Uses the KV cache; sampling is ``softmax(logits / temperature)``.
    """
    model = policy.model
    # transformers >= 5 names the KV cache `cache`, 4.x `past_key_values`
    cache_name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out = model(input_ids=prompts, use_cache=True, logits_to_keep=1)
    tokens = []
    for _ in range(max_new_tokens):
        probs = torch.softmax(out.logits[:, -1].float() / temperature, dim=-1)
        token = torch.multinomial(probs, 1, generator=generator)
        tokens.append(token)
        out = model(input_ids=token, use_cache=True, logits_to_keep=1, **{cache_name: getattr(out, cache_name)})
    return torch.cat(tokens, dim=1)


def completion_log_probs(model: torch.nn.Module, sequences: torch.Tensor, prompt_len: int,
                         temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(log π(o_t), entropy H_t) of each completion token (B, T) under softmax(logits / temperature)."""
    logits = model(input_ids=sequences).logits[:, prompt_len - 1 : -1].float() / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    tokens = sequences[:, prompt_len:]
    token_log_prob = log_probs.gather(-1, tokens[..., None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)  # H = -Σ π log π
    return token_log_prob, entropy


def completion_mask(completions: torch.Tensor, eos_id: int) -> torch.Tensor:
    """Float (B, T): 1 up to and including the first ``<eos>``, 0 after it."""
    is_eos = (completions == eos_id).long()
    before = torch.cumsum(is_eos, dim=1) - is_eos  # number of <eos> strictly before t
    return (before == 0).float()


def group_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """GRPO advantages (B,): rewards normalised within consecutive groups of ``group_size``."""
    grouped = rewards.view(-1, group_size)
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True)
    return ((grouped - mean) / (std + 1e-6)).view(-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp_min(1.0)


# --------------------------------------------------------------------------------------------------------
# Warm-up and evaluation
# --------------------------------------------------------------------------------------------------------


def warm_up(policy: Policy, task: Task, config: TrainConfig, generator: torch.Generator) -> float:
    """Supervised warm-up: cross-entropy on the completion tokens of the task's demonstrations.

    Two phases with one AdamW: ``warmup_steps`` batches in which half the demonstrations are correct (the
    policy learns both the right strategy and the habit), then ``habit_steps`` batches with the task's
    ``demo_correct`` fraction (the habit takes over, so the right strategy becomes a rare branch it can still
    complete).  Returns the last batch's loss.  Demonstrations are drawn with ``generator``.
    """
    model, device = policy.model, policy.to_model.device
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.warmup_lr, weight_decay=0.0)
    model.train()
    loss = torch.zeros(())
    phases = [0.5] * config.warmup_steps + [None] * config.habit_steps
    for correct in phases:
        demos = policy.to_model[task.demonstrations(config.warmup_batch, generator, correct).to(device)]
        logits = model(input_ids=demos).logits[:, task.prompt_len - 1 : -1]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), demos[:, task.prompt_len :].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return float(loss.detach())


@torch.no_grad()
def evaluate(policy: Policy, task: Task, config: TrainConfig) -> dict[str, float]:
    r"""Sample ``eval_k`` completions for each of ``eval_prompts`` fixed prompts (the same for every run).

    Returns ``eval_reward`` (mean reward), ``eval_accuracy`` (fraction exactly right), ``eval_pass_at_k``
    (fraction of prompts with at least one exactly right completion among k), ``eval_entropy`` (mean token
    entropy of the sampling distribution), ``eval_fork_frac`` (fraction of completion tokens whose entropy
    exceeds 0.1 nat: the decisions that are still open), and from one teacher-forced pass over the correct
    answers ``eval_answer_prob`` (mean over prompts of :math:`\pi(\text{answer})`, how rare the rewarded
    strategy is) and ``eval_first_token_prob`` (mean of :math:`\pi(\text{first answer token})`, the fork of
    ``reverse``).  Uses private generators, so the training random streams are untouched.
    """
    device = policy.to_model.device
    prompt_generator = torch.Generator().manual_seed(2**31 - 1)  # fixed eval set
    sample_generator = torch.Generator(device=device).manual_seed(config.seed + 7919)
    unique = task.prompts(config.eval_prompts, prompt_generator).to(device)
    prompts = unique.repeat_interleave(config.eval_k, dim=0)
    policy.model.eval()
    answers = torch.cat([policy.to_model[unique], policy.to_model[task.answers(unique)]], dim=1)
    answer_log_prob, _ = completion_log_probs(policy.model, answers, task.prompt_len, config.temperature)
    completions = sample(policy, policy.to_model[prompts], task.max_new_tokens, config.temperature, sample_generator)
    sequences = torch.cat([policy.to_model[prompts], completions], dim=1)
    _, entropy = completion_log_probs(policy.model, sequences, task.prompt_len, config.temperature)
    mask = completion_mask(completions, int(policy.to_model[EOS]))
    task_completions = policy.from_model[completions]
    rewards = task.reward(prompts, task_completions)
    correct = task.is_correct(prompts, task_completions).float()
    return {
        "eval_reward": float(rewards.mean()),
        "eval_accuracy": float(correct.mean()),
        "eval_pass_at_k": float(correct.view(-1, config.eval_k).amax(dim=1).mean()),
        "eval_entropy": float(masked_mean(entropy, mask)),
        "eval_fork_frac": float(masked_mean((entropy > 0.1).float(), mask)),
        "eval_answer_prob": float(answer_log_prob.sum(dim=1).exp().mean()),
        "eval_first_token_prob": float(answer_log_prob[:, 0].exp().mean()),
    }


# --------------------------------------------------------------------------------------------------------
# One RL step
# --------------------------------------------------------------------------------------------------------


def rl_step(policy: Policy, task: Task, config: TrainConfig, optimizer: torch.optim.Optimizer,
            data_generator: torch.Generator, sample_generator: torch.Generator) -> dict[str, float]:
    """Rollout → rewards → advantages → old log-probs → ppo_epochs × minibatches updates; returns metrics."""
    model, device = policy.model, policy.to_model.device
    start = time.perf_counter()

    # 1. rollout: G completions for each prompt, sampled at temperature τ
    prompts = task.prompts(config.prompts_per_step, data_generator).repeat_interleave(config.group_size, dim=0)
    prompts = prompts.to(device)
    model.eval()
    completions = sample(policy, policy.to_model[prompts], task.max_new_tokens, config.temperature, sample_generator)
    sequences = torch.cat([policy.to_model[prompts], completions], dim=1)
    mask = completion_mask(completions, int(policy.to_model[EOS]))

    # 2. verifiable rewards and group-normalised advantages
    task_completions = policy.from_model[completions]
    rewards = task.reward(prompts, task_completions)
    correct = task.is_correct(prompts, task_completions).float()
    advantages = group_advantages(rewards, config.group_size)

    # 3. old log-probs under the sampling distribution (frozen policy, same temperature)
    with torch.no_grad():
        old_log_prob, entropy = completion_log_probs(model, sequences, task.prompt_len, config.temperature)

    # 4. the ratio bounds depend only on the old log-probs: once per batch, timed (the Band's cost)
    loss_kwargs = config.loss_kwargs()
    bounds_start = time.perf_counter()
    log_lower, log_upper = log_ratio_bounds(old_log_prob, **_bounds_kwargs(loss_kwargs))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    bounds_time = time.perf_counter() - bounds_start

    # 5. several optimisation passes over the batch, so the ratio moves away from 1
    model.train()
    batch = sequences.shape[0]
    size = batch // config.minibatches
    sums: dict[str, torch.Tensor] = {}
    for _ in range(config.ppo_epochs):
        order = torch.randperm(batch, generator=data_generator).to(device)
        for index in order.view(config.minibatches, size):
            log_prob, _ = completion_log_probs(model, sequences[index], task.prompt_len, config.temperature)
            loss, metrics = band_policy_loss(log_prob, old_log_prob[index], advantages[index], mask[index],
                                             log_bounds=(log_lower[index], log_upper[index]), **loss_kwargs)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            metrics = {**metrics, "loss": loss.detach(), "grad_norm": grad_norm.detach(),
                       "abs_log_ratio": masked_mean((log_prob.detach() - old_log_prob[index]).abs(), mask[index])}
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value
    calls = config.ppo_epochs * config.minibatches
    # how far the ratio moved over the whole batch after the last update (one extra forward pass)
    with torch.no_grad():
        new_log_prob, _ = completion_log_probs(model, sequences, task.prompt_len, config.temperature)
        final_log_ratio = (new_log_prob - old_log_prob) * mask
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    step_time = time.perf_counter() - start

    line = {
        "reward": float(rewards.mean()),
        "accuracy": float(correct.mean()),
        "group_pass": float(correct.view(-1, config.group_size).amax(dim=1).mean()),
        "entropy": float(masked_mean(entropy, mask)),
        "fork_frac": float(masked_mean((entropy > 0.1).float(), mask)),
        "response_length": float(mask.sum(dim=1).mean()),
        **{key: float(value) / calls for key, value in sums.items()},
        "final_abs_log_ratio": float(final_log_ratio.abs().sum() / mask.sum()),
        "final_max_abs_log_ratio": float(final_log_ratio.abs().max()),
        "time_step_s": step_time,
    }
    if config.method == "band":
        line.update({"time_band_s": bounds_time, "band_cost_frac": bounds_time / step_time})
    return line


def _bounds_kwargs(loss_kwargs: dict) -> dict:
    """The arguments of :func:`log_ratio_bounds` among the loss's keyword arguments."""
    names = ("method", "divergence", "delta", "max_ratio", "clip_eps", "clip_eps_high")
    return {name: loss_kwargs[name] for name in names if name in loss_kwargs}


# --------------------------------------------------------------------------------------------------------
# Checkpoints and metrics
# --------------------------------------------------------------------------------------------------------


def _save_checkpoint(path: Path, step: int, policy: Policy, optimizer: torch.optim.Optimizer,
                     data_generator: torch.Generator, sample_generator: torch.Generator, config: TrainConfig,
                     **extra: float) -> None:
    state = {
        **extra,
        "step": step,
        "config": config.to_json(),
        "model": policy.model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "data_rng": data_generator.get_state(),
        "sample_rng": sample_generator.get_state(),
    }
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # atomic: an interruption never leaves half a checkpoint


def _truncate_metrics(path: Path, step: int) -> None:
    """Keep only the metric lines of steps <= ``step`` (drops lines written after the last checkpoint)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        if line.strip() and json.loads(line)["step"] <= step:
            kept.append(line)
    path.write_text("".join(line + "\n" for line in kept))


#: What a warm start must share with the run that wrote it (the warm-up and the random streams).
_WARM_UP_FIELDS = ("task", "reward", "digits", "base", "demo_correct", "demo_noise", "model", "size",
                   "warmup_steps", "habit_steps", "warmup_batch", "warmup_lr", "seed")


def _check_warm_start(saved: TrainConfig, config: TrainConfig, path: str | Path) -> None:
    for name in _WARM_UP_FIELDS:
        old, new = getattr(saved, name), getattr(config, name)
        if old != new:
            raise ValueError(f"warm_start: {name} differs from {str(path)!r} ({new!r} vs saved {old!r})")


def _check_resumable(saved: TrainConfig, config: TrainConfig) -> None:
    for field in dataclasses.fields(TrainConfig):
        if field.name in ("steps", "device", "save_every"):
            continue
        old, new = getattr(saved, field.name), getattr(config, field.name)
        if old != new:
            raise ValueError(f"resume: {field.name} differs from the checkpoint ({new!r} vs saved {old!r})")


# --------------------------------------------------------------------------------------------------------
# A whole run
# --------------------------------------------------------------------------------------------------------


def make_policy(config: TrainConfig, task: Task) -> Policy:
    if config.model is not None:
        return load_policy(config.model, task.symbols)
    return build_tiny_policy(task.symbols, size=config.size, seed=config.seed,
                             max_len=task.prompt_len + task.max_new_tokens)


def run(config: TrainConfig, out: str | Path, *, resume: bool = False, max_steps: int | None = None,
        warm_start: str | Path | None = None, progress: bool = True,
        threads: int | None = 1) -> list[dict[str, Any]]:
    """Train one policy; write ``out/metrics.jsonl`` (one line per step) and ``out/checkpoint.pt``.

    Parameters
    ----------
    config : the run's settings.
    out : output directory (created).
    resume : continue from ``out/checkpoint.pt`` (metric lines after its step are dropped and recomputed).
    max_steps : stop after this step (a checkpoint is written), e.g. to split a run; ``config.steps`` is the
        length of the whole run.
    warm_start : the ``warmup.pt`` of another run with the same seed and task/warm-up settings: its policy and
        random streams replace the warm-up, so the run is identical to one that did the warm-up itself
        (``--compare`` warms up once per seed and starts every method from there).
    progress : show a tqdm progress bar.
    threads : torch CPU threads for the run (restored afterwards); a tiny model runs fastest on one, and the
        same count gives the same numbers.  ``None`` keeps torch's setting.

    Returns
    -------
    The metric lines written by this call.  Line 0 describes the warmed-up policy (the regime); the last line
    (step ``config.steps``) carries the final evaluation (``eval_*``).
    """
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _run(config, Path(out), resume, max_steps, warm_start, progress)
    finally:
        torch.set_num_threads(previous_threads)


def _run(config: TrainConfig, out: Path, resume: bool, max_steps: int | None,
         warm_start: str | Path | None, progress: bool) -> list[dict[str, Any]]:
    out.mkdir(parents=True, exist_ok=True)
    metrics_path, checkpoint_path = out / METRICS_FILE, out / CHECKPOINT_FILE
    device = torch.device(config.device)
    stop = config.steps if max_steps is None else min(max_steps, config.steps)

    # seed → task → policy → optimiser → random streams
    torch.manual_seed(config.seed)
    task = config.make_task()
    policy = make_policy(config, task).to(device)
    optimizer = torch.optim.Adam(policy.model.parameters(), lr=config.lr)
    data_generator = torch.Generator().manual_seed(config.seed)
    sample_generator = torch.Generator(device=device).manual_seed(config.seed + 1)

    if resume and checkpoint_path.exists():
        state = torch.load(checkpoint_path, map_location=device, weights_only=True)
        _check_resumable(TrainConfig(**json.loads(state["config"])), config)
        policy.model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        data_generator.set_state(state["data_rng"])
        sample_generator.set_state(state["sample_rng"].to("cpu"))
        step = int(state["step"])
        _truncate_metrics(metrics_path, step)
    else:
        if metrics_path.exists() and not resume:
            raise ValueError(f"out: {str(out)!r} already holds {METRICS_FILE}; pass --resume or choose a new --out")
        metrics_path.unlink(missing_ok=True)
        step = 0
        started = time.perf_counter()
        if warm_start is not None:
            state = torch.load(warm_start, map_location=device, weights_only=True)
            _check_warm_start(TrainConfig(**json.loads(state["config"])), config, warm_start)
            policy.model.load_state_dict(state["model"])
            data_generator.set_state(state["data_rng"])
            sample_generator.set_state(state["sample_rng"].to("cpu"))
            warmup_loss = float(state["warmup_loss"])
        else:
            warmup_loss = warm_up(policy, task, config, data_generator)
        first = {"step": 0, "warmup_loss": warmup_loss, **evaluate(policy, task, config),
                 "time_step_s": time.perf_counter() - started}
        _append(metrics_path, first)
        _save_checkpoint(checkpoint_path, 0, policy, optimizer, data_generator, sample_generator, config)
        _save_checkpoint(out / WARMUP_FILE, 0, policy, optimizer, data_generator, sample_generator, config,
                         warmup_loss=warmup_loss)

    written = []
    started = time.perf_counter()
    bar = _progress(progress, initial=step, total=stop)
    while step < stop:
        line = rl_step(policy, task, config, optimizer, data_generator, sample_generator)
        step += 1
        if step == config.steps or (config.eval_every and step % config.eval_every == 0):
            line.update(evaluate(policy, task, config))
        line = {"step": step, **line, "time_total_s": time.perf_counter() - started}
        _append(metrics_path, line)
        written.append(line)
        if step == stop or (config.save_every and step % config.save_every == 0):
            _save_checkpoint(checkpoint_path, step, policy, optimizer, data_generator, sample_generator, config)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(reward=f"{line['reward']:.3f}", entropy=f"{line['entropy']:.3f}",
                            clipfrac=f"{line['clipfrac']:.3f}")
    if bar is not None:
        bar.close()
    return written


def _append(path: Path, line: dict[str, Any]) -> None:
    with path.open("a") as handle:
        handle.write(json.dumps(line) + "\n")
        handle.flush()


def _progress(enabled: bool, initial: int, total: int):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(initial=initial, total=total, desc="train", unit="step", dynamic_ncols=True)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The lines of a ``metrics.jsonl``."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


# --------------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------------


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """The TrainConfig fields given on the command line."""
    names = {field.name for field in dataclasses.fields(TrainConfig)}
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def _handle(args: argparse.Namespace) -> int:
    if args.compare:
        from .compare import compare

        summary = compare(args.out, overrides=_given(args), seeds=args.seeds, quick=args.quick,
                          resume=args.resume, progress=not args.no_progress, threads=args.threads)
        columns = {"reward": "reward", "entropy": "entropy", "pass_at_k": f"pass@{summary['eval_k']}",
                   "reward_auc": "reward AUC", "reward_early": "reward early", "entropy_late": "entropy late"}
        print(f"{'method':<12} " + " ".join(f"{label:>15}" for label in columns.values()))
        for name, entry in summary["methods"].items():
            cells = [f"{entry[key]['mean']:.3f} ± {entry[key]['std']:.3f}" for key in columns]
            print(f"{name:<12} " + " ".join(f"{cell:>15}" for cell in cells))
        reference = summary["paired"]["reference"]
        for name in summary["methods"]:
            if name != reference:
                auc = summary["paired"][name]["reward_auc"]
                print(f"{name} - {reference}: reward AUC {auc['mean']:+.3f} ± {auc['std']:.3f}, ahead on "
                      f"{auc['ahead']}/{summary['seeds']} seeds")
        print(f"summary: {Path(args.out) / 'summary.json'} ({summary['wall_time_s']:.0f} s)")
        return 0
    if args.quick:
        raise ValueError("quick: --quick only applies to --compare")
    config = TrainConfig(**_given(args))
    lines = run(config, args.out, resume=args.resume, max_steps=args.max_steps, progress=not args.no_progress,
                threads=args.threads)
    if lines and "eval_reward" in lines[-1]:
        last = lines[-1]
        print(f"final: reward {last['eval_reward']:.3f}, accuracy {last['eval_accuracy']:.3f}, "
              f"pass@{config.eval_k} {last['eval_pass_at_k']:.3f}, entropy {last['eval_entropy']:.3f}")
    print(f"metrics: {Path(args.out) / METRICS_FILE}")
    return 0


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    defaults = TrainConfig()
    p = subparsers.add_parser(
        "train", help="train a small policy with GRPO/BandPO, or --compare clip / clip-higher / band-kl",
        description=__doc__.split("\n\n")[0].replace("``", ""),
    )
    p.add_argument("--out", required=True, help="output directory (metrics.jsonl, checkpoint.pt, plots)")
    p.add_argument("--compare", action="store_true", help="train clip, clip-higher and band-kl over several seeds")
    p.add_argument("--quick", action="store_true", help="with --compare: the small budget (a few minutes on CPU)")
    p.add_argument("--seeds", type=int, help="with --compare: number of seeds (default 5)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--max-steps", type=int, dest="max_steps", help="stop after this step (resume later)")
    p.add_argument("--no-progress", action="store_true", dest="no_progress", help="no progress bar")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: fastest for tiny models)")
    task = p.add_argument_group("task")
    task.add_argument("--task", choices=sorted(TASKS), help=f"verifiable task (default {defaults.task})")
    task.add_argument("--reward", choices=("exact", "digits"), help=f"reward (default {defaults.reward})")
    task.add_argument("--digits", type=int,
                      help=f"digits per operand (add) or string length (reverse) ({defaults.digits})")
    task.add_argument("--base", type=int, help=f"number base ({defaults.base})")
    task.add_argument("--demo-correct", type=float, dest="demo_correct",
                      help=f"warm-up fraction of correct demonstrations ({defaults.demo_correct})")
    task.add_argument("--demo-noise", type=float, dest="demo_noise",
                      help=f"warm-up fraction of noisy demonstrations ({defaults.demo_noise})")
    model = p.add_argument_group("policy")
    model.add_argument("--model", help="local Hugging Face model directory (default: build a tiny Llama)")
    model.add_argument("--size", choices=sorted(MODEL_SIZES), help=f"size of the built model ({defaults.size})")
    model.add_argument("--device", help=f"torch device, e.g. cpu or cuda ({defaults.device})")
    loss = p.add_argument_group("loss")
    loss.add_argument("--method", choices=("band", "clip", "clip-higher"), help=f"bounds ({defaults.method})")
    loss.add_argument("--divergence", help=f"Band divergence ({defaults.divergence})")
    loss.add_argument("--delta", type=float, help=f"Band radius δ ({defaults.delta})")
    loss.add_argument("--clip-eps", type=float, dest="clip_eps", help=f"clip ε ({defaults.clip_eps})")
    loss.add_argument("--clip-eps-high", type=float, dest="clip_eps_high", help="clip-higher ε_high (0.28)")
    loss.add_argument("--dual-clip", type=float, dest="dual_clip", help="dual-clip constant c > 1")
    loss.add_argument("--max-ratio", type=float, dest="max_ratio", help="cap on the upper bound")
    loss.add_argument("--loss-agg-mode", dest="loss_agg_mode", help=f"aggregation ({defaults.loss_agg_mode})")
    loop = p.add_argument_group("RL loop")
    for name, kind, text in (
        ("steps", int, "RL steps"),
        ("prompts_per_step", int, "prompts per step"),
        ("group_size", int, "completions per prompt"),
        ("ppo_epochs", int, "passes over each batch"),
        ("minibatches", int, "minibatches per pass"),
        ("lr", float, "Adam learning rate"),
        ("temperature", float, "sampling temperature"),
        ("warmup_steps", int, "warm-up steps of the skill phase"),
        ("habit_steps", int, "warm-up steps of the habit phase"),
        ("warmup_batch", int, "warm-up batch size"),
        ("warmup_lr", float, "warm-up learning rate"),
        ("eval_prompts", int, "evaluation prompts"),
        ("eval_k", int, "samples per evaluation prompt (pass@k)"),
        ("eval_every", int, "evaluate every N steps (0: only at the end)"),
        ("seed", int, "random seed"),
        ("save_every", int, "checkpoint every N steps (0: only at the end)"),
    ):
        flag = "--" + name.replace("_", "-")
        loop.add_argument(flag, type=kind, dest=name, help=f"{text} ({getattr(defaults, name)})")
    p.set_defaults(handler=_handle)
