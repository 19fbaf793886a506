"""Train a tiny, locally built causal LM with TRL's GRPO and the Band as its ratio clip (CPU, no download).

    python examples/trl_grpo.py --max-steps 8

The task: the prompt is "say <word>", the reward is 1 when the first completion word is <word>.  The model is
a randomly initialised two-layer Llama over a word-level vocabulary, so the first steps already move the ratio
(num_iterations = 2: each batch is optimised twice) and the Band's clip metrics show up in the log beside
those of the fixed clip it replaces.  Only the two lines marked "BandPO" differ from a plain TRL GRPO script.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence

from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

from bandcore.rl.trl import BandGRPOConfig, BandGRPOTrainer

WORDS = ["red", "green", "blue", "cat", "dog", "sun", "moon", "tree"]
SPECIAL = ["[PAD]", "[UNK]", "[EOS]"]


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate([*SPECIAL, "say", *WORDS])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]", padding_side="left"
    )


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int):
    import torch

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    return AutoModelForCausalLM.from_config(config)


def say_reward(prompts, completions, completion_ids, target, **kwargs) -> list[float]:
    """1.0 when the completion starts with the requested word, else 0.0."""
    return [float(text.split()[:1] == [word]) for text, word in zip(completions, target, strict=True)]


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=8)
    parser.add_argument("--delta", type=float, default=0.05, help="the Band's radius δ")
    parser.add_argument("--divergence", default="kl")
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default=None, help="where TRL may write (default: a temporary folder)")
    parser.add_argument("--log-json", default=None, help="write the training log (one dict per step) here")
    args = parser.parse_args(argv)

    tokenizer = build_tokenizer()
    model = build_model(tokenizer, args.seed)
    dataset = Dataset.from_dict({"prompt": [f"say {w}" for w in WORDS] * 4, "target": WORDS * 4})
    with tempfile.TemporaryDirectory() as tmp:
        config = BandGRPOConfig(  # BandPO
            output_dir=args.output_dir or tmp,
            band_divergence=args.divergence,
            band_delta=args.delta,
            num_iterations=2,  # the ratio only moves when a batch is optimised more than once
            max_steps=args.max_steps,
            learning_rate=args.learning_rate,
            per_device_train_batch_size=8,
            num_generations=4,
            max_completion_length=3,
            temperature=1.0,
            beta=0.0,
            logging_steps=1,
            seed=args.seed,
            use_cpu=True,
            bf16=False,
            activation_checkpointing=False,  # set explicitly: TRL's default sets the deprecated alias
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
        )
        trainer = BandGRPOTrainer(  # BandPO
            model=model, reward_funcs=say_reward, args=config, train_dataset=dataset, processing_class=tokenizer
        )
        trainer.train()
    log = [entry for entry in trainer.state.log_history if "loss" in entry]
    keys = ("reward", "clip_ratio/region_mean", "band/clip_ratio_fixed/region_mean", "band/width_mean")
    for entry in log:
        print(f"step {entry['step']:3d}  " + "  ".join(f"{k} {entry[k]:.4f}" for k in keys if k in entry))
    if args.log_json:
        with open(args.log_json, "w") as fh:
            json.dump(log, fh, indent=1)
    return log


if __name__ == "__main__":
    main()
