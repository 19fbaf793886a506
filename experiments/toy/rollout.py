r"""Rollout pieces of the toy trainer: sampling, log-probabilities, masks, advantages, warm-up and evaluation.

GRPO advantages: for the :math:`G` completions :math:`o_1..o_G` of one prompt with rewards :math:`R_i`,

.. math::  A_i = \frac{R_i - \operatorname{mean}(R)}{\operatorname{std}(R) + 10^{-6}},

the same for every token of :math:`o_i`.  Log-probabilities are those of the sampling distribution
:math:`\operatorname{softmax}(z/\tau)` (temperature :math:`\tau`), and the token entropy is
:math:`H_t = -\sum_v \pi_v \log \pi_v` of that distribution.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from .config import TrainConfig
from .model import Policy
from .tasks import EOS, Task

__all__ = ["completion_log_probs", "completion_mask", "evaluate", "group_advantages", "masked_mean", "sample",
           "warm_up"]


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
    r""":math:`\sum m v / \max(\sum m, 1)`: the mean of ``values`` over the tokens of ``mask`` (0 when empty)."""
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
