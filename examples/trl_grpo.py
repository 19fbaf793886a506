r"""GRPO in TRL with the Band as its ratio clip: a tiny Llama learns a verifiable task on the CPU (no download).

    python examples/trl_grpo.py --out runs/trl_grpo [--max-steps 160] [--divergence kl] [--delta 0.05] [--seed 0]
        [--loss-form clip|dppo] [--delta-schedule linear --delta-end 0.02]
        [--max-ratio 10] [--dual-clip 10] [--loss-type grpo]     (BandPO's settings: examples/recipes/trl_bandpo.sh)

Everything is built here, nothing comes from a model hub:

1. **Task**: reverse a digit string (``--task reverse``, the default) or add two numbers (``--task add``), from
   :mod:`experiments.toy.tasks`.  Its prompts and answers become the text columns of a ``datasets.Dataset``
   (``"prompt"``: ``"4721="``, ``"answer"``: ``"1274"``).
2. **Tokenizer**: one token per character, its vocabulary trained with ``tokenizers`` (``WordLevelTrainer``) on
   the task's strings, wrapped as a ``PreTrainedTokenizerFast`` (left padding; ``<eos>`` ends a completion).
3. **Model**: a two-layer Llama built from a ``LlamaConfig``.
4. **Warm-up**: supervised cross-entropy on the task's demonstrations, first half of them correct (the model
   learns both the task and the habit: copying the string, or adding without carries), then mostly the habit.
   The right answer stays reachable but rare, so the reward starts low but above 0.
5. **GRPO**: :class:`bandcore.rl.trl.BandGRPOTrainer` with reward functions of TRL's signature
   (``reward(completions, **kwargs) -> list[float]``; the dataset's ``"answer"`` column arrives as a keyword).
   Each generated batch is optimised twice (``num_iterations=2``), so the ratio moves and the Band clips.
6. **Output**: ``OUT/log.json`` (TRL's log, one entry per optimizer step) and ``OUT/curves.png`` (reward, token
   entropy and clip fractions per step).

Only the lines marked "BandPO" differ from a plain TRL GRPO script.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    PrinterCallback,
    TrainingArguments,
    set_seed,
)

from bandcore.rl.trl import BandGRPOConfig, BandGRPOTrainer
from experiments.toy.tasks import BOS, EOS, PAD, Task, get_task

#: Task name -> problem size used here (string length for reverse, digits per operand for add).
TASK_SIZES = {"reverse": 4, "add": 2}
SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")
#: Log keys drawn in the plot and printed in the summary.
CURVES = ("reward", "entropy", "band/clip_ratio/region", "band/clip_ratio_fixed/region_mean")


def make_task(name: str = "reverse") -> Task:
    """The task ``name`` at this example's size, with the toy's warm-up mixture (10% correct demonstrations)."""
    if name not in TASK_SIZES:
        raise ValueError(f"task must be one of {sorted(TASK_SIZES)}, got {name!r}")
    return get_task(name, **{"length" if name == "reverse" else "n_digits": TASK_SIZES[name]})


def to_text(task: Task, ids: torch.Tensor) -> list[str]:
    """Rows of task ids as strings: ``<bos>`` and ``<pad>`` dropped, everything from ``<eos>`` on cut off."""
    texts = []
    for row in ids.tolist():
        row = row[: row.index(EOS)] if EOS in row else row
        texts.append("".join(task.symbols[i] for i in row if i not in (PAD, BOS)))
    return texts


def build_dataset(task: Task, size: int, seed: int) -> Dataset:
    """``size`` RL problems: ``"prompt"`` (text the model continues) and ``"answer"`` (the verified result)."""
    prompts = task.prompts(size, torch.Generator().manual_seed(seed))
    return Dataset.from_dict({"prompt": to_text(task, prompts), "answer": to_text(task, task.answers(prompts))})


def build_tokenizer(task: Task) -> PreTrainedTokenizerFast:
    """A character-level tokenizer whose vocabulary is trained on the task's strings (prompts and answers)."""
    demos = task.demonstrations(512, torch.Generator().manual_seed(0), correct=0.5)
    corpus = [*to_text(task, demos), "".join(task.symbols[3:])]  # every symbol at least once
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()  # "1274", not "1 2 7 4"
    tokenizer.train_from_iterator(corpus, trainer=trainers.WordLevelTrainer(special_tokens=list(SPECIAL_TOKENS)))
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left",
        model_input_names=["input_ids", "attention_mask"],
    )


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int) -> LlamaForCausalLM:
    """A two-layer Llama (about 0.1 M parameters) over the tokenizer's vocabulary, initialised with ``seed``."""
    set_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=32, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=None, tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def task_to_tokens(task: Task, tokenizer: PreTrainedTokenizerFast) -> torch.Tensor:
    """Lookup table task id -> token id (``<bos>`` -> -1: it is not used here)."""
    special = {PAD: tokenizer.pad_token_id, BOS: -1, EOS: tokenizer.eos_token_id}
    ids = [special.get(i, tokenizer.convert_tokens_to_ids(s)) for i, s in enumerate(task.symbols)]
    return torch.tensor(ids, dtype=torch.long)


def warm_up(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, task: Task, steps: int, seed: int,
            batch: int = 64, lr: float = 3e-3) -> float:
    """Supervised warm-up on the task's demonstrations; returns the last batch's cross-entropy.

    The first 60% of the ``steps`` use demonstrations half of which are correct, the rest the task's mixture
    (10% correct): the habit takes over and the right answer becomes a rare branch the model can still finish.
    """
    generator = torch.Generator().manual_seed(seed)
    lookup = task_to_tokens(task, tokenizer)
    start = task.prompt_len - 1  # the first completion token (the <bos> column is dropped)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    loss = torch.zeros(())
    for step in range(steps):
        correct = 0.5 if step < 0.6 * steps else None
        tokens = lookup[task.demonstrations(batch, generator, correct)[:, 1:]]
        logits = model(input_ids=tokens).logits[:, start - 1 : -1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, start:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return float(loss.detach())


def exact_match(completions: list[str], answer: list[str], **kwargs: Any) -> list[float]:
    """1.0 when the completion (decoded up to ``<eos>``) is exactly the answer, else 0.0."""
    return [float(text == target) for text, target in zip(completions, answer, strict=True)]


def digit_match(completions: list[str], answer: list[str], **kwargs: Any) -> list[float]:
    """Partial credit: the fraction of the answer's characters, and of its end, that the completion gets right."""
    scores = []
    for text, target in zip(completions, answer, strict=True):
        right = sum(a == b for a, b in zip(text, target, strict=False)) + (len(text) == len(target))
        scores.append(right / (len(target) + 1))
    return scores


REWARDS = {"exact": exact_match, "digits": digit_match}


def cpu_settings() -> dict[str, Any]:
    """TrainingArguments for a quiet CPU run: fp32, no checkpointing, no reports, nothing saved.

    Activation checkpointing is switched off under the name the installed transformers uses
    (``activation_checkpointing`` from 5.x; ``gradient_checkpointing``, now a deprecated alias, before).
    """
    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    checkpointing = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    return {"use_cpu": True, "bf16": False, checkpointing: False, "report_to": "none", "save_strategy": "no",
            "disable_tqdm": True}


def plot(log: list[dict[str, Any]], path: Path) -> None:
    """Reward, token entropy and clip fractions (the Band's and the fixed clip's) per optimizer step, as a PNG.

    The reward is measured at the steps that generate (every ``num_iterations``-th); the clip fractions are drawn
    at the other steps, the later passes over a batch, where the ratio has moved (on the first pass it is 1).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(key: str, entries: list[dict[str, Any]]) -> tuple[list[int], list[float]]:
        kept = [entry for entry in entries if key in entry]
        return [entry["step"] for entry in kept], [entry[key] for entry in kept]

    later_passes = [entry for entry in log if "reward" not in entry]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), constrained_layout=True)
    axes[0].plot(*series("reward", log), marker=".")
    axes[0].set_ylabel("reward (mean over completions)")
    axes[1].plot(*series("entropy", log), marker=".")
    axes[1].set_ylabel("token entropy (nat)")
    for key, label in (("band/clip_ratio/region", "Band"), ("band/clip_ratio_fixed/region_mean", "fixed clip 0.2")):
        axes[2].plot(*series(key, later_passes), marker=".", label=label)
    axes[2].set_ylabel("clipped fraction of tokens")
    axes[2].legend()
    for axis in axes:
        axis.set_xlabel("optimizer step")
        axis.grid(alpha=0.3)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def window_line(window: list[dict[str, Any]]) -> str:
    """One line for consecutive log entries: mean reward (generating steps), entropy, clip fractions (later
    passes, where the ratio has moved)."""

    def mean(key: str, entries: list[dict[str, Any]]) -> str:
        values = [entry[key] for entry in entries if key in entry]
        return f"{sum(values) / len(values):.3f}" if values else "  n/a"

    later = [entry for entry in window if "reward" not in entry]
    return (f"steps {window[0]['step']:4d}-{window[-1]['step']:<4d}  reward {mean('reward', window)}  entropy "
            f"{mean('entropy', window)}  clipped: Band {mean(CURVES[2], later)}, fixed clip {mean(CURVES[3], later)}")


def summary(log: list[dict[str, Any]], last: int = 5) -> dict[str, float]:
    """Reward at the first generation and mean reward over the ``last`` generations (the run's headline)."""
    rewards = [entry["reward"] for entry in log if "reward" in entry]
    return {"reward_first": rewards[0], f"reward_last{last}": sum(rewards[-last:]) / len(rewards[-last:])}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/trl_grpo", help="folder for log.json and curves.png")
    parser.add_argument("--max-steps", type=int, default=160, help="GRPO optimizer steps")
    parser.add_argument("--divergence", default="kl", help="the Band's f-divergence")
    parser.add_argument("--delta", type=float, default=0.05, help="the Band's radius δ")
    parser.add_argument("--loss-form", default="clip", choices=("clip", "dppo"),
                        help="clip: PPO's clip at the Band (BandPO); dppo: DPPO's objective (TRL's cispo loss)")
    parser.add_argument("--delta-schedule", default="constant", choices=("constant", "linear", "cosine", "exponential"),
                        help="move δ from --delta to --delta-end over the --max-steps optimizer steps")
    parser.add_argument("--delta-end", type=float, default=None, help="the last δ of --delta-schedule")
    parser.add_argument("--max-ratio", type=float, default=None, help="cap on the Band's upper ratio bound")
    parser.add_argument("--dual-clip", type=float, default=None,
                        help="TRL's delta: the ratio of a token's unclipped loss is capped here (BandPO's dual clip)")
    parser.add_argument("--loss-type", default=None, help="TRL's loss_type (grpo: mean over a sequence's tokens, "
                        "then over sequences); default dapo, cispo with --loss-form dppo")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--task", default="reverse", choices=sorted(TASK_SIZES))
    parser.add_argument("--reward", default="exact", choices=sorted(REWARDS))
    parser.add_argument("--warmup-steps", type=int, default=300, help="supervised warm-up steps (0: none)")
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the model is tiny: 1 is fastest)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Warm up, train with GRPO and the Band, write ``log.json`` and ``curves.png``; returns the per-step log."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    # transformers 5 deprecates a property that TRL reads at every generation; nothing to act on here
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    task = make_task(args.task)
    tokenizer = build_tokenizer(task)
    model = build_model(tokenizer, args.seed)
    warmup_loss = warm_up(model, tokenizer, task, args.warmup_steps, args.seed) if args.warmup_steps else None
    config = BandGRPOConfig(  # BandPO
        output_dir=str(out / "trainer"),
        band_divergence=args.divergence,
        band_delta=args.delta,
        band_loss_form=args.loss_form,
        # TRL's truncated-IS loss (cispo) carries the dppo form
        loss_type=args.loss_type or ("cispo" if args.loss_form == "dppo" else "dapo"),
        band_delta_schedule=args.delta_schedule,
        band_delta_end=args.delta_end,
        band_delta_steps=None if args.delta_schedule == "constant" else args.max_steps,
        band_max_ratio=args.max_ratio,
        delta=args.dual_clip,
        num_iterations=2,  # each generated batch is optimised twice: the ratio moves and the Band acts
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        per_device_train_batch_size=64,  # 8 prompts x 8 completions per generation
        num_generations=8,
        max_completion_length=task.max_new_tokens,
        temperature=1.0,
        logging_steps=1,
        seed=args.seed,
        **cpu_settings(),
    )
    print(f"BandPO: {config.band_divergence} delta={config.band_delta:g} max_ratio={config.band_max_ratio} "
          f"dual clip (TRL delta)={config.delta} loss_type={config.loss_type}")
    trainer = BandGRPOTrainer(  # BandPO
        model=model, reward_funcs=REWARDS[args.reward], args=config,
        train_dataset=build_dataset(task, 4096, args.seed + 1), processing_class=tokenizer,
    )
    trainer.remove_callback(PrinterCallback)  # the summary below instead of one dict per step
    trainer.train()
    log = [entry for entry in trainer.state.log_history if "loss" in entry]  # one entry per optimizer step
    (out / "log.json").write_text(json.dumps(log, indent=1))
    plot(log, out / "curves.png")
    seconds = time.perf_counter() - started
    if warmup_loss is not None:
        print(f"warm-up: {args.warmup_steps} steps, last cross-entropy {warmup_loss:.3f}")
    for first in range(0, len(log), 20):
        print(window_line(log[first : first + 20]))
    headline = "  ".join(f"{k} {v:.3f}" for k, v in summary(log).items())
    print(f"{len(log)} GRPO steps, {seconds:.0f} s in all; {headline}; wrote {out / 'log.json'}, {out / 'curves.png'}")
    return log


if __name__ == "__main__":
    main()
