"""GPU check of the verl recipe (examples/recipes/verl_bandpo.yaml): a few GRPO steps of verl 0.9.1's own trainer
with the Band, on one GPU, with a tiny model built here (no download).

    python scripts/gpu_check_recipes.py [--steps 3] [--work /tmp/bandpo_gpu_check] [--json out.json]

Needs a CUDA GPU, ``verl==0.9.1`` with its GPU stack (vLLM for the rollout, Ray) and bandcore importable.  It
builds in ``--work``: a 4-layer Llama (hidden 256, head dim 64: sizes vLLM's attention kernels take) and a
character-level tokenizer with a chat template, saved as a Hugging Face checkpoint; train and validation parquet
files in verl's RL format (prompts "Write the digit 7:" and the like); a reward function (the fraction of the
response's characters that are the asked digit, so advantages vary from the first step).  Then it runs
``python -m verl.trainer.main_ppo --config-path examples/recipes --config-name verl_bandpo`` with overrides that
shrink the run to one GPU and ``--steps`` steps (``ppo_epochs=2``, so each batch is optimised twice and the ratio
moves), parses verl's console metrics and checks (exit status 1 if any fails):

* the trainer exits 0 and logs ``--steps`` training steps;
* the Band ran as verl's policy loss: ``actor/band_width``, ``actor/band_clipfrac_high`` and
  ``actor/band_clipfrac_low`` are logged at every step, the width finite and > 0;
* ``actor/pg_loss`` and ``actor/grad_norm`` are finite at every step.

This script has not been run on a GPU by its author (written for verl 0.9.1's config keys and console logger by
reading them); its report says what failed if a key has moved.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "examples" / "recipes"
DIGITS = "0123456789"


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """verl's custom reward signature: the fraction of the response's characters that are the asked digit."""
    text = solution_str.strip()
    return sum(ch == ground_truth for ch in text) / len(text) if text else 0.0


def build_model(directory: Path) -> None:
    """A character-level tokenizer with a chat template and a 4-layer Llama, saved as an HF checkpoint."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    chars = sorted(set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 :.,!?'\n"))
    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {token: i for i, token in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()  # characters back to the text, without separators
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                        unk_token="<unk>")  # fmt: skip
    tokenizer.chat_template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                               "{% if add_generation_prompt %}{{ ' ' }}{% endif %}")  # fmt: skip
    tokenizer.save_pretrained(directory)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)


def build_data(directory: Path) -> tuple[Path, Path]:
    """verl's RL parquet format: data_source, prompt (chat messages), ability, reward_model, extra_info."""
    import pandas as pd

    def rows(split: str, n: int):
        return [{"data_source": "bandcore/digits", "prompt": [{"role": "user", "content": f"Write the digit {d}:"}],
                 "ability": "copy", "reward_model": {"style": "rule", "ground_truth": d},
                 "extra_info": {"split": split, "index": i}}
                for i, d in enumerate(DIGITS[i % 10] for i in range(n))]  # fmt: skip

    paths = directory / "train.parquet", directory / "val.parquet"
    for path, (split, n) in zip(paths, (("train", 256), ("val", 16)), strict=True):
        pd.DataFrame(rows(split, n)).to_parquet(path)
    return paths


def overrides(model: Path, train: Path, val: Path, steps: int) -> list[str]:
    """The recipe shrunk to one GPU and a few steps (the Band's settings are the recipe's)."""
    return [
        f"data.train_files={train}", f"data.val_files={val}", "data.train_batch_size=16",
        "data.max_prompt_length=32", "data.max_response_length=32", "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.optim.lr=1e-4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        f"reward.custom_reward_function.path={Path(__file__).resolve()}",
        "reward.custom_reward_function.name=compute_score", "trainer.nnodes=1", "trainer.n_gpus_per_node=1",
        f"trainer.total_training_steps={steps}", "trainer.val_before_train=False", "trainer.test_freq=-1",
        "trainer.save_freq=-1", "trainer.logger=['console']", "trainer.project_name=bandcore-gpu-check",
        "trainer.experiment_name=verl-recipe",
    ]  # fmt: skip


#: verl's console logger (pprint.pformat of each number): "step:3 - actor/pg_loss:0.123 - actor/x:np.float64(1.2)"
STEP_LINE = re.compile(r"step:(\d+)\s+-\s+(.*)")
METRIC = re.compile(r"([\w/@.\-]+):(?:np\.\w+\()?([-+]?(?:[0-9.]+(?:[eE][-+]?[0-9]+)?|nan|inf))")


def parse_steps(text: str) -> dict[int, dict[str, float]]:
    steps = {}
    for match in STEP_LINE.finditer(text):
        values = {}
        for key, value in METRIC.findall(match.group(2)):
            try:
                values[key] = float(value)
            except ValueError:
                continue
        steps[int(match.group(1))] = values
    return steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bandpo_gpu_check"))
    parser.add_argument("--timeout", type=int, default=540, help="seconds for the verl run")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report: dict = {"checks": []}

    def check(name: str, ok: bool, **details) -> None:
        report["checks"].append({"check": name, "ok": bool(ok), **details})

    import torch

    check("cuda available", torch.cuda.is_available())
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        check("vllm importable (verl's rollout)", False, error=str(err))
    if all(c["ok"] for c in report["checks"]):
        model, data = args.work / "model", args.work / "data"
        model.mkdir(parents=True, exist_ok=True)
        data.mkdir(parents=True, exist_ok=True)
        build_model(model)
        train, val = build_data(data)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               "VERL_USE_EXTERNAL_MODULES": "bandcore.rl.verl"}  # fmt: skip
        command = [sys.executable, "-m", "verl.trainer.main_ppo", f"--config-path={RECIPES}",
                   "--config-name=verl_bandpo", *overrides(model, train, val, args.steps)]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout, check=False)
            output, code = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired as err:
            output, code = f"{err.stdout or ''}{err.stderr or ''}", "timeout"
        (args.work / "verl.log").write_text(output if isinstance(output, str) else str(output))
        steps = parse_steps(output)
        check("verl exits 0", code == 0, returncode=code, log=str(args.work / "verl.log"), tail=output[-2000:])
        check(f"{args.steps} training steps logged", len(steps) >= args.steps, logged=sorted(steps))
        for step, values in sorted(steps.items()):
            band = ("actor/band_width", "actor/band_clipfrac_high", "actor/band_clipfrac_low")
            check(f"step {step}: the Band's metrics", all(k in values for k in band),
                  **{k: values.get(k) for k in band})  # fmt: skip
            width = values.get("actor/band_width", math.nan)
            check(f"step {step}: band width finite and > 0", math.isfinite(width) and width > 0, width=width)
            for key in ("actor/pg_loss", "actor/grad_norm"):
                check(f"step {step}: {key} finite", math.isfinite(values.get(key, math.nan)), value=values.get(key))
    failed = [c for c in report["checks"] if not c["ok"]]
    for c in report["checks"]:
        print(("ok    " if c["ok"] else "FAIL  ") + c["check"])
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    print(f"{len(report['checks']) - len(failed)}/{len(report['checks'])} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
