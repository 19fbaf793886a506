"""The mechanism sweep (bandcore train --sweep) on a micro budget, its per-run numbers and the bound floor."""

from __future__ import annotations

import json
import math

import pytest
import torch

from bandcore.cli import main
from bandcore.rl.bounds import log_ratio_bounds
from experiments.toy.config import TrainConfig
from experiments.toy.sweep import run_metrics, sweep
from experiments.toy.train import METRICS_FILE, ratio_bounds, read_metrics

MICRO = {"steps": 3, "warmup_steps": 6, "habit_steps": 3, "warmup_batch": 16, "prompts_per_step": 2,
         "group_size": 4, "ppo_epochs": 2, "minibatches": 2, "eval_prompts": 4, "eval_k": 4, "lr": 3e-3,
         "reward": "digits"}


def test_min_ratio_floors_the_bands_lower_bound_only():
    old = torch.log(torch.tensor([[0.005, 0.05, 0.5, 0.9]], dtype=torch.float64))
    band_lower, band_upper = log_ratio_bounds(old, method="band", divergence="kl", delta=0.05)
    lower, upper = ratio_bounds(old, TrainConfig(method="band", delta=0.05, min_ratio=0.8))
    torch.testing.assert_close(upper, band_upper)  # the Band's upper bound is kept
    torch.testing.assert_close(lower, band_lower.clamp_min(math.log(0.8)))
    # rare tokens: the Band's l ≈ 1.7e-5 and 0.16 are raised to 0.8; common ones keep their (higher) l
    assert lower[0, :3].exp().tolist() == pytest.approx([0.8, 0.8, 0.8])
    assert lower[0, 3].exp() == pytest.approx(band_lower[0, 3].exp()) and band_lower[0, 3].exp() > 0.8
    capped_lower, capped_upper = ratio_bounds(old, TrainConfig(method="band", delta=0.05, max_ratio=1.2))
    torch.testing.assert_close(capped_lower, band_lower)
    assert capped_upper.exp().max() == pytest.approx(1.2)
    with pytest.raises(ValueError, match="min_ratio"):
        TrainConfig(min_ratio=1.0)


def _step(step, entropy, reward, **extra):
    return {"step": step, "entropy": entropy, "reward": reward, **extra}


def test_run_metrics_by_hand():
    lines = [{"step": 0, "eval_answer_prob": 0.01},
             _step(1, 0.9, 0.0, **{"token_frac/p<0.01": 0.1, "clipfrac_low/p<0.01": 0.5,
                                   "clipfrac_high/p<0.01": 0.0, "final_log_ratio_neg/p<0.01": -2.0}),
             _step(2, 0.6, 0.5, **{"token_frac/p<0.01": 0.3, "clipfrac_low/p<0.01": 0.1,
                                   "clipfrac_high/p<0.01": 0.2, "final_log_ratio_neg/p<0.01": -1.0,
                                   "final_log_ratio_pos/p<0.01": 0.5}),
             _step(3, 0.3, 1.0, **{"token_frac/p<0.01": 0.0, "eval_entropy": 0.25, "eval_reward": 0.75})]
    numbers = run_metrics(lines)
    assert numbers["entropy_late"] == pytest.approx(0.3)  # last third of three steps: step 3
    assert numbers["reward_auc"] == pytest.approx(0.5)
    assert (numbers["entropy_final"], numbers["reward_final"], numbers["start_answer_prob"]) == (0.25, 0.75, 0.01)
    # token-weighted over the steps with rare tokens: (0.5 * 0.1 + 0.1 * 0.3) / 0.4
    assert numbers["clip_low_rare"] == pytest.approx(0.2)
    assert numbers["clip_high_rare"] == pytest.approx(0.15)
    assert numbers["log_ratio_neg_rare"] == pytest.approx(-1.5) and numbers["log_ratio_pos_rare"] == 0.5
    assert numbers["clip_low_common"] is None  # no step had a p >= 0.5 token


def test_sweep_on_a_micro_budget(tmp_path, capsys):
    out = tmp_path / "sweep"
    variants = ("band δ=0.05", "band-upper δ=0.05")
    result = sweep(out, overrides=MICRO, seeds=2, rarities=(0.1,), noises=(0.35,), variants=variants,
                   progress=False)
    assert list(result["variants"]) == ["clip", *variants]  # clip first: the reference and the warm-up
    cell = result["cells"]["correct0.1-noise0.35"]
    assert set(cell["paired"]) == set(variants)
    run_dir = out / "runs" / "correct0.1-noise0.35"
    for name, directory in (("clip", "clip"), ("band δ=0.05", "band_delta0.05")):
        per_seed = [run_metrics(read_metrics(run_dir / directory / f"seed{k}" / METRICS_FILE))["entropy_late"]
                    for k in range(2)]
        assert cell["variants"][name]["entropy_late"]["per_seed"] == pytest.approx(per_seed)
    diff = cell["paired"]["band δ=0.05"]["entropy_late"]
    clip, band = (cell["variants"][n]["entropy_late"]["per_seed"] for n in ("clip", "band δ=0.05"))
    assert diff["per_seed"] == pytest.approx([b - c for b, c in zip(band, clip, strict=True)])
    pooled = result["pooled"]["paired"]["band δ=0.05"]["entropy_late"]  # one cell: pooled = that cell
    assert pooled["per_seed"] == diff["per_seed"] and pooled["n"] == 2
    # every variant started from clip's warm-up: the same warmed-up policy (step-0 evaluation)
    starts = {json.dumps(read_metrics(run_dir / d / "seed1" / METRICS_FILE)[0]["eval_answer_prob"])
              for d in ("clip", "band_delta0.05", "band-upper_delta0.05")}
    assert len(starts) == 1
    assert (out / "mechanism.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (out / "sweep.md").read_text()
    assert "| correct0.1-noise0.35 |" in table and "| band-upper δ=0.05 |" in table
    assert json.loads((out / "sweep.json").read_text())["cells"] == json.loads(json.dumps(result["cells"]))
    # a second call refuses; --resume keeps the finished runs
    with pytest.raises(ValueError, match="already holds a sweep"):
        sweep(out, overrides=MICRO, seeds=2, rarities=(0.1,), noises=(0.35,), variants=variants, progress=False)
    before = (run_dir / "clip" / "seed0" / METRICS_FILE).read_bytes()
    again = sweep(out, overrides=MICRO, seeds=2, rarities=(0.1,), noises=(0.35,), variants=variants,
                  resume=True, progress=False)
    assert (run_dir / "clip" / "seed0" / METRICS_FILE).read_bytes() == before
    assert again["cells"] == result["cells"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sweep", "--compare"], "--sweep and --compare are two different experiments"),
        (["--sweep", "--quick"], "--quick only applies to --compare"),
        (["--sweep", "--delta", "0.1"], r"\['delta'\] are set by the grid"),
        (["--sweep", "--max-steps", "2"], "--max-steps does not apply to --sweep"),
        (["--seeds", "2"], "--seeds only applies to --compare or --sweep"),
    ],
)
def test_cli_sweep_refuses_bad_combinations_before_any_work(tmp_path, capsys, args, message):
    out = tmp_path / "s"
    assert main(["train", "--out", str(out), "--no-progress", *args]) == 2
    assert message.replace("\\", "") in capsys.readouterr().err.replace("\\", "")
    assert not out.exists()
