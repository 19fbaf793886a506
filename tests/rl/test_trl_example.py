"""The TRL trl_example (examples/trl_grpo.py): its tokenizer, data and reward functions, and a real run of it."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "trl_grpo.py"



def test_the_tokenizer_is_character_level_and_trained_on_the_task(trl_example):
    task = trl_example.make_task("add")
    tokenizer = trl_example.build_tokenizer(task)
    assert set(tokenizer.get_vocab()) == {*trl_example.SPECIAL_TOKENS, *"0123456789+="}
    assert tokenizer.get_vocab() == trl_example.build_tokenizer(task).get_vocab()  # the same on every process
    ids = tokenizer("47+38=")["input_ids"]
    assert len(ids) == 6 and tokenizer.decode(ids) == "47+38="
    # a completion as TRL decodes it: special tokens (the <eos> that ends it, padding) dropped, no spaces
    completion = tokenizer("580")["input_ids"] + [tokenizer.eos_token_id, tokenizer.pad_token_id]
    assert tokenizer.batch_decode([completion], skip_special_tokens=True) == ["580"]
    batch = tokenizer(["12=", "4721="], padding=True)
    assert batch["attention_mask"][0] == [0, 0, 1, 1, 1]  # left padding, as generation needs


def test_the_dataset_holds_verifiable_problems(trl_example):
    reverse = trl_example.build_dataset(trl_example.make_task("reverse"), 32, seed=3)
    assert reverse.column_names == ["prompt", "answer"]
    for prompt, answer in zip(reverse["prompt"], reverse["answer"], strict=True):
        assert re.fullmatch(r"\d{4}=", prompt) and answer == prompt[:-1][::-1] != prompt[:-1]
    add = trl_example.build_dataset(trl_example.make_task("add"), 32, seed=3)
    for prompt, answer in zip(add["prompt"], add["answer"], strict=True):
        a, b = re.fullmatch(r"(\d\d)\+(\d\d)=", prompt).groups()
        assert len(answer) == 3 and int(answer[::-1]) == int(a) + int(b)  # least significant digit first
    assert trl_example.build_dataset(trl_example.make_task("reverse"), 32, seed=3)["prompt"] == reverse["prompt"]


def test_reward_functions_take_trls_arguments(trl_example):
    """TRL calls reward(prompts=, completions=, completion_ids=, <dataset columns>, trainer_state=, ...)."""
    completions = ["1274", "1247", "4721", "", "12745"]
    trl_kwargs = dict(prompts=["4721="] * 5, completion_ids=[[0]] * 5, trainer_state=None,
                      log_extra=lambda *a: None, log_metric=lambda *a: None)
    assert trl_example.exact_match(completions=completions, answer=["1274"] * 5, **trl_kwargs) == [1, 0, 0, 0, 0]
    scores = trl_example.digit_match(completions=completions, answer=["1274"] * 5, **trl_kwargs)
    assert scores == pytest.approx([1.0, 3 / 5, 1 / 5, 0.0, 4 / 5])  # per character, plus the right length


def test_cpu_settings_build_a_quiet_config(trl_example, tmp_path):
    """A config from cpu_settings() raises no deprecation warning (filterwarnings = error) on this transformers."""
    from bandcore.rl.trl import BandGRPOConfig

    config = BandGRPOConfig(output_dir=str(tmp_path), **trl_example.cpu_settings())
    assert config.use_cpu and not config.bf16 and not config.gradient_checkpointing
    assert getattr(config, "activation_checkpointing", False) is False


def test_an_unknown_task_is_refused(trl_example):
    with pytest.raises(ValueError, match=r"task must be one of \['add', 'reverse'\], got 'sort'"):
        trl_example.make_task("sort")


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", data[:16]
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@pytest.mark.slow
def test_the_example_trains_and_the_reward_rises(tmp_path):
    """The trl_example as a user runs it (60 GRPO steps after its default warm-up, about 20 s on one CPU thread)."""
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, str(EXAMPLE), "--max-steps", "60", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=600, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = json.loads((out / "log.json").read_text())
    assert [entry["step"] for entry in log] == list(range(1, 61))
    buckets = {"band/clip_ratio/p<0.01", "band/clip_ratio/p0.01-0.1", "band/clip_ratio/p0.1-0.5",
               "band/clip_ratio/p>=0.5"}
    for entry in log:
        for key in ("band/clip_ratio/low", "band/clip_ratio/high", "band/clip_ratio/region",
                    "band/clip_ratio_fixed/region_mean", "entropy"):
            assert math.isfinite(entry[key]) and 0 <= entry[key] <= (math.inf if key == "entropy" else 1), key
        assert entry["band/width_mean"] > 0
        assert entry["band/clip_ratio/region"] == pytest.approx(entry["clip_ratio/region_mean"], abs=1e-6)  # the Band
        assert set(entry) & buckets
    # every other step generates (num_iterations=2): its first pass is on-policy, the second one is not
    generating = [entry for entry in log if "reward" in entry]
    later = [entry for entry in log if "reward" not in entry]
    assert [entry["step"] for entry in generating] == list(range(1, 61, 2))
    assert all(entry["band/clip_ratio_fixed/region_mean"] == 0 for entry in generating)
    assert sum(entry["band/clip_ratio/region"] > 0 for entry in later) >= 5
    assert any(entry["band/clip_ratio/region"] != entry["band/clip_ratio_fixed/region_mean"] for entry in later)
    # the warm-up leaves the right answer rare but reachable; GRPO makes it common
    rewards = torch.tensor([entry["reward"] for entry in generating])
    assert 0 < rewards[:5].mean() < 0.3
    assert rewards[-5:].mean() > rewards[:5].mean() + 0.15, rewards.tolist()
    summary = re.search(r"60 GRPO steps, .* reward_first (\S+)  reward_last5 (\S+);", done.stdout)
    assert summary, done.stdout[-2000:]
    assert float(summary.group(1)) == pytest.approx(float(rewards[0]), abs=5e-4)
    assert float(summary.group(2)) == pytest.approx(float(rewards[-5:].mean()), abs=5e-4)
    # the plot: a real PNG of the figure's size (13 x 3.6 inches at 110 dpi), not a blank canvas
    data = (out / "curves.png").read_bytes()
    assert _png_size(data) == (1430, 396) and len(data) > 20_000
