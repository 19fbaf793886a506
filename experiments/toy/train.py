r"""``bandcore train``: a small GRPO / BandPO loop in torch that reads top to bottom.

One run: seed → build (or load) the policy → supervised warm-up (so the right strategy starts rare) →
for each step: rollout (groups of completions per prompt) → verifiable rewards → group-normalised advantages
(:func:`~experiments.toy.rollout.group_advantages`) → old log-probs under the sampling distribution →
``ppo_epochs`` passes of ``minibatches`` optimiser steps with :func:`bandcore.rl.band_policy_loss` → one line of
``metrics.jsonl``.  The old log-probs are :math:`\log\pi_{old}(o_t)` of :math:`\operatorname{softmax}(z/\tau)`,
recomputed by one forward pass of the frozen policy, so the first optimiser step sees a ratio of exactly 1 and
later ones see it move.

Reproducibility: all randomness comes from two ``torch.Generator`` objects (prompts/minibatch order on the
CPU, token sampling on the device) whose states are checkpointed with the model and optimiser, so a run
stopped with ``max_steps`` and continued with ``resume=True`` writes the same metric lines as an uninterrupted
run (the wall-clock fields :data:`TIMING_FIELDS` excepted).  Checkpoints hold state dicts and tensors only and
are read with ``torch.load(..., weights_only=True)``.

A run directory is never overwritten by accident: everything (configuration, output directory, checkpoint,
warm start) is checked before any work, ``resume=True`` without a checkpoint refuses, and so does a fresh run
into a directory that already holds a run, unless ``new_run=True`` (see :func:`run`).

The Band's cost: the bounds depend only on the old log-probs, so each step computes them once for the whole
batch (:func:`bandcore.rl.bounds.log_ratio_bounds`) and hands each minibatch its slice; for ``method="band"``
that call is timed and ``band_cost_frac`` = its time / the step's time is logged.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from bandcore.rl.bounds import log_ratio_bounds
from bandcore.rl.loss import band_policy_loss

from .buckets import bucket_masks, bucket_metrics, clipped_by_bucket
from .config import TrainConfig
from .model import Policy, build_tiny_policy, load_policy
from .rollout import completion_log_probs, completion_mask, evaluate, group_advantages, masked_mean, sample, warm_up
from .tasks import EOS, Task

__all__ = ["CHECKPOINT_FILE", "METRICS_FILE", "RUN_FILES", "TIMING_FIELDS", "WARMUP_FILE", "TrainConfig",
           "deterministic_state", "make_policy", "ratio_bounds", "read_metrics", "rl_step", "run"]

METRICS_FILE = "metrics.jsonl"
CHECKPOINT_FILE = "checkpoint.pt"
WARMUP_FILE = "warmup.pt"
#: The files a run writes into its directory.
RUN_FILES = (METRICS_FILE, CHECKPOINT_FILE, WARMUP_FILE)
#: Fields of a metrics line that measure wall-clock time and so differ between two identical runs.
TIMING_FIELDS = ("time_step_s", "time_total_s", "band_cost_frac", "time_band_s")


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

    # 4. the ratio bounds depend only on the old log-probs: once per batch, timed (the Band's cost); check=True
    #    verifies log p <= 0 once per batch, so the loss calls below skip their value checks (check=False)
    loss_kwargs = config.loss_kwargs()
    if device.type == "cuda":  # the timer must not include the forward pass still queued on the device
        torch.cuda.synchronize(device)
    bounds_start = time.perf_counter()
    log_lower, log_upper = ratio_bounds(old_log_prob, config)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    bounds_time = time.perf_counter() - bounds_start

    # 5. several optimisation passes over the batch, so the ratio moves away from 1
    model.train()
    batch = sequences.shape[0]
    size = batch // config.minibatches
    sums: dict[str, torch.Tensor] = {}
    bucket = bucket_masks(old_log_prob, mask)  # (K, B, T) token weights per old-probability bucket
    side_sums = torch.zeros(2, bucket.shape[0], device=device)  # clipped tokens (low, high) per bucket, summed
    for _ in range(config.ppo_epochs):
        order = torch.randperm(batch, generator=data_generator).to(device)
        for index in order.view(config.minibatches, size):
            log_prob, _ = completion_log_probs(model, sequences[index], task.prompt_len, config.temperature)
            loss, metrics = band_policy_loss(log_prob, old_log_prob[index], advantages[index], mask[index],
                                             log_bounds=(log_lower[index], log_upper[index]), check=False,
                                             **loss_kwargs)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            metrics = {**metrics, "loss": loss.detach(), "grad_norm": grad_norm.detach(),
                       "abs_log_ratio": masked_mean((log_prob.detach() - old_log_prob[index]).abs(), mask[index])}
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value
            side_sums += clipped_by_bucket(log_prob.detach() - old_log_prob[index], advantages[index],
                                            log_lower[index], log_upper[index], bucket[:, index])
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
        **bucket_metrics(bucket, side_sums, config.ppo_epochs, final_log_ratio, advantages),
    }
    if config.method == "band":
        line.update({"time_band_s": bounds_time, "band_cost_frac": bounds_time / step_time})
    return line


def ratio_bounds(old_log_prob: torch.Tensor, config: TrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    r""":math:`(\log l, \log u)` of ``config``'s method (:func:`bandcore.rl.bounds.log_ratio_bounds`, with its
    ``max_ratio`` cap :math:`u \le` max_ratio) and, with ``min_ratio``, the floor :math:`l \leftarrow \max(l,
    \text{min\_ratio})`."""
    log_lower, log_upper = log_ratio_bounds(old_log_prob, **config.bounds_kwargs())
    if config.min_ratio is not None:
        log_lower = log_lower.clamp_min(math.log(config.min_ratio))
    return log_lower, log_upper


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
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in kept))


#: What a warm start must share with the run that wrote it (the warm-up and the random streams).
_WARM_UP_FIELDS = ("task", "reward", "digits", "base", "demo_correct", "demo_noise", "model", "size",
                   "warmup_steps", "habit_steps", "warmup_batch", "warmup_lr", "seed")
#: What may change when a run is resumed.
_RESUMABLE_CHANGES = ("steps", "device", "save_every")


def _saved_config(state: dict[str, Any], path: Path) -> dict[str, Any]:
    """The configuration stored in a checkpoint, as a dict (not re-validated: its model path may have moved)."""
    try:
        saved = json.loads(state["config"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path}: not a checkpoint of `bandcore train` (no readable config: {err})") from None
    defaults = {field.name: field.default for field in dataclasses.fields(TrainConfig)}
    return {**defaults, **saved}  # a field added since the checkpoint was written takes its default


def _check_warm_start(saved: dict[str, Any], config: TrainConfig, path: str | Path) -> None:
    for name in _WARM_UP_FIELDS:
        old, new = saved[name], getattr(config, name)
        if old != new:
            raise ValueError(f"warm_start: {name} differs from {str(path)!r} ({new!r} vs saved {old!r})")


def _check_resumable(saved: dict[str, Any], config: TrainConfig) -> None:
    for field in dataclasses.fields(TrainConfig):
        if field.name in _RESUMABLE_CHANGES:
            continue
        old, new = saved[field.name], getattr(config, field.name)
        if old != new:
            raise ValueError(f"resume: {field.name} differs from the checkpoint ({new!r} vs saved {old!r})")


def _load(path: Path, device: torch.device) -> dict[str, Any]:
    return torch.load(path, map_location=device, weights_only=True)


# --------------------------------------------------------------------------------------------------------
# A whole run
# --------------------------------------------------------------------------------------------------------


def make_policy(config: TrainConfig, task: Task) -> Policy:
    """The policy of ``config``: its local model directory, or a freshly built Llama of ``config.size``."""
    if config.model is not None:
        return load_policy(config.model, task.symbols)
    return build_tiny_policy(task.symbols, size=config.size, seed=config.seed,
                             max_len=task.prompt_len + task.max_new_tokens)


def _check_count(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name}: must be a positive integer or None, got {value!r}")


def _plan(config: TrainConfig, out: Path, resume: bool, new_run: bool, warm_start: str | Path | None,
          device: torch.device) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """Every check before any work: ``(checkpoint state to resume from, warm-start state)``, at most one set."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: {str(out)!r} exists and is not a directory")
    checkpoint_path = out / CHECKPOINT_FILE
    if resume and checkpoint_path.exists():
        state = _load(checkpoint_path, device)
        _check_resumable(_saved_config(state, checkpoint_path), config)
        return state, None
    existing = [name for name in RUN_FILES if (out / name).exists()]
    if resume and not new_run:
        held = f"; its {', '.join(existing)} stay untouched" if existing else ""
        raise ValueError(f"resume: {str(out)!r} has no {CHECKPOINT_FILE} to resume from{held} (pass --new-run to "
                         "start a new run there, which overwrites its files)")
    if existing and not new_run:
        raise ValueError(f"out: {str(out)!r} already holds {', '.join(existing)}; pass --resume to continue that "
                         "run, --new-run to overwrite it, or choose a new --out")
    if warm_start is None:
        return None, None
    warm_start = Path(warm_start)
    if not warm_start.is_file():
        raise ValueError(f"warm_start: {str(warm_start)!r} is not a file")
    state = _load(warm_start, device)
    _check_warm_start(_saved_config(state, warm_start), config, warm_start)
    return None, state


def run(config: TrainConfig, out: str | Path, *, resume: bool = False, new_run: bool = False,
        max_steps: int | None = None, warm_start: str | Path | None = None, progress: bool = True,
        threads: int | None = 1) -> list[dict[str, Any]]:
    """Train one policy; write ``out/metrics.jsonl`` (one line per step) and ``out/checkpoint.pt``.

    Parameters
    ----------
    config : the run's settings (validated when it was built).
    out : output directory (created).
    resume : continue from ``out/checkpoint.pt`` (metric lines after its step are dropped and recomputed); the
        configuration must equal the checkpoint's except ``steps``, ``device`` and ``save_every``.  Without a
        checkpoint this refuses (``ValueError``) and changes nothing, unless ``new_run``.
    new_run : allow a new run to overwrite the run files (``metrics.jsonl``, ``checkpoint.pt``, ``warmup.pt``)
        of ``out``; without it a fresh run into a directory that holds any of them refuses.  With ``resume`` it
        means "resume if there is a checkpoint, else start a new run".
    max_steps : stop after this step (a checkpoint is written), e.g. to split a run; ``config.steps`` is the
        length of the whole run.
    warm_start : the ``warmup.pt`` of another run with the same seed and task/warm-up settings: its policy and
        random streams replace the warm-up, so the run is identical to one that did the warm-up itself
        (``--compare`` warms up once per seed and starts every method from there).  Ignored when resuming.
    progress : show a tqdm progress bar.
    threads : torch CPU threads for the run (restored afterwards); a tiny model runs fastest on one, and the
        same count gives the same numbers.  ``None`` keeps torch's setting.  The run also switches on
        ``torch.use_deterministic_algorithms`` (strict on the CPU, ``warn_only`` on other devices; restored
        afterwards), so two identical runs on one machine write identical metrics (timing fields aside).

    Returns
    -------
    The metric lines written by this call.  Line 0 describes the warmed-up policy (the regime); the last line
    (step ``config.steps``) carries the final evaluation (``eval_*``).
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    _check_count("max_steps", max_steps)
    _check_count("threads", threads)
    out, device = Path(out), torch.device(config.device)
    resumed, warm = _plan(config, out, bool(resume), bool(new_run), warm_start, device)
    previous = torch.get_num_threads(), deterministic_state()
    if threads is not None:
        torch.set_num_threads(threads)
    # deterministic kernels: strict on the CPU; elsewhere a kernel without a deterministic version only warns
    torch.use_deterministic_algorithms(True, warn_only=device.type != "cpu")
    try:
        return _run(config, out, resumed, warm, max_steps, progress)
    finally:
        torch.set_num_threads(previous[0])
        torch.use_deterministic_algorithms(previous[1]["deterministic_algorithms"],
                                           warn_only=previous[1]["deterministic_warn_only"])


def deterministic_state() -> dict[str, Any]:
    """What makes two runs on one machine give the same numbers: torch's threads and deterministic mode."""
    return {"torch_threads": torch.get_num_threads(),
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
            "torch_version": torch.__version__}


def _run(config: TrainConfig, out: Path, resumed: dict[str, Any] | None, warm: dict[str, Any] | None,
         max_steps: int | None, progress: bool) -> list[dict[str, Any]]:
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

    if resumed is not None:
        policy.model.load_state_dict(resumed["model"])
        optimizer.load_state_dict(resumed["optimizer"])
        data_generator.set_state(resumed["data_rng"])
        sample_generator.set_state(resumed["sample_rng"].to("cpu"))
        step = int(resumed["step"])
        _truncate_metrics(metrics_path, step)
    else:
        for name in RUN_FILES:  # a new run (checked by _plan: absent, or new_run=True)
            (out / name).unlink(missing_ok=True)
        step = 0
        started = time.perf_counter()
        if warm is not None:
            policy.model.load_state_dict(warm["model"])
            data_generator.set_state(warm["data_rng"])
            sample_generator.set_state(warm["sample_rng"].to("cpu"))
            warmup_loss = float(warm["warmup_loss"])
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


def run_finished(directory: Path, steps: int) -> bool:
    """Whether the run in ``directory`` logged all ``steps`` and its final evaluation (``--resume`` skips it)."""
    path = Path(directory) / METRICS_FILE
    if not path.exists():
        return False
    lines = read_metrics(path)
    return bool(lines) and lines[-1]["step"] == steps and "eval_reward" in lines[-1]
