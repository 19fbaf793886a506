"""The small GRPO/BandPO trainer: end to end on CPU, determinism, resume, checkpoints, CLI, --compare."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest
import torch

from bandcore.cli import build_parser, main
from experiments.toy.buckets import P_BUCKETS, bucket_masks, bucket_metrics, clipped_by_bucket
from experiments.toy.compare import compare, render_markdown, summarise
from experiments.toy.config import TrainConfig
from experiments.toy.model import build_tiny_policy
from experiments.toy.rollout import completion_log_probs, completion_mask, group_advantages, sample
from experiments.toy.stats import t_quantile
from experiments.toy.train import CHECKPOINT_FILE, METRICS_FILE, TIMING_FIELDS, deterministic_state, read_metrics, run

#: A micro budget: seconds on CPU.
MICRO = {"steps": 4, "warmup_steps": 6, "habit_steps": 3, "warmup_batch": 16, "prompts_per_step": 2,
         "group_size": 4, "ppo_epochs": 2, "minibatches": 2, "eval_prompts": 4, "eval_k": 4, "lr": 3e-3,
         "reward": "digits"}  # partial credit: even an untrained policy gets non-zero advantages


def _without_timing(lines):
    return [{k: v for k, v in line.items() if k not in TIMING_FIELDS} for line in lines]


def test_group_advantages_normalise_within_each_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    adv = group_advantages(rewards, 4)
    assert adv[4:].abs().max() == 0  # a group with equal rewards carries no signal
    assert adv[:4].sum().abs() < 1e-6 and adv[0] > 0 > adv[1]
    assert adv[0].item() == pytest.approx(0.75 / torch.tensor([1.0, 0, 0, 0]).std().item(), rel=1e-5)


def test_completion_mask_keeps_tokens_up_to_the_first_eos():
    completions = torch.tensor([[5, 2, 7, 2], [2, 5, 5, 5], [5, 5, 5, 5]])
    assert completion_mask(completions, eos_id=2).tolist() == [[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]]


def test_sampled_tokens_follow_the_distribution_the_old_log_probs_describe():
    torch.manual_seed(0)
    policy = build_tiny_policy(("<pad>", "<bos>", "<eos>", "a", "b"), seed=0)
    prompts = torch.tensor([[1, 3, 4]] * 6)
    completions = sample(policy, prompts, 5, temperature=0.7, generator=torch.Generator().manual_seed(0))
    assert completions.shape == (6, 5)
    sequences = torch.cat([prompts, completions], dim=1)
    with torch.no_grad():
        log_prob, entropy = completion_log_probs(policy.model, sequences, 3, temperature=0.7)
        # the cached incremental logits (used to sample) equal the full forward's (used for old log-probs)
        full = torch.log_softmax(policy.model(input_ids=sequences).logits[:, 2:-1] / 0.7, dim=-1)
    torch.testing.assert_close(log_prob, full.gather(-1, completions[..., None]).squeeze(-1))
    assert (entropy > 0).all() and (entropy <= torch.log(torch.tensor(5.0)) + 1e-5).all()


def test_a_few_steps_run_end_to_end_and_write_metrics(tmp_path):
    lines = run(TrainConfig(method="band", **MICRO), tmp_path, progress=False)
    written = read_metrics(tmp_path / METRICS_FILE)
    assert [line["step"] for line in written] == list(range(MICRO["steps"] + 1))
    assert written[1:] == lines
    first, last = written[0], written[-1]
    assert {"warmup_loss", "eval_accuracy", "eval_pass_at_k", "eval_entropy", "eval_fork_frac"} <= first.keys()
    # π(answer) is a product that includes π(first answer token), prompt by prompt, so also in the mean
    assert 0.0 < first["eval_answer_prob"] <= first["eval_first_token_prob"] <= 1.0
    for key in ("reward", "entropy", "clipfrac", "clipfrac_high", "clipfrac_low", "approx_kl", "band_width",
                "final_abs_log_ratio", "time_step_s", "band_cost_frac", "eval_reward", "eval_pass_at_k"):
        assert key in last, key
    # several updates per batch: the ratio moved away from 1 (the clip had something to do)
    assert max(line["final_abs_log_ratio"] for line in written[1:]) > 1e-3
    # clip fractions by side and old-probability bucket: the buckets partition the tokens
    for line in written[1:]:
        assert sum(line[f"token_frac/{name}"] for name, _, _ in P_BUCKETS) == pytest.approx(1.0)
        for name, _, _ in P_BUCKETS:
            if line[f"token_frac/{name}"] > 0:
                assert 0.0 <= line[f"clipfrac_low/{name}"] <= 1.0 and 0.0 <= line[f"clipfrac_high/{name}"] <= 1.0
    assert all(0.0 <= line["band_cost_frac"] for line in written[1:])
    state = torch.load(tmp_path / CHECKPOINT_FILE, weights_only=True)  # state dicts and tensors only
    assert state["step"] == MICRO["steps"] and {"model", "optimizer", "data_rng", "sample_rng"} <= state.keys()


def test_same_seed_same_metrics_other_seed_other_metrics(tmp_path):
    config = TrainConfig(method="clip", **MICRO)
    before = deterministic_state()
    a = run(config, tmp_path / "a", progress=False, threads=1)
    assert deterministic_state() == before  # threads and deterministic mode restored after the run
    b = run(config, tmp_path / "b", progress=False)
    c = run(TrainConfig(method="clip", **{**MICRO, "seed": 1}), tmp_path / "c", progress=False)
    assert _without_timing(a) == _without_timing(b)
    assert _without_timing(a) != _without_timing(c)


def test_resume_after_an_interruption_gives_the_uninterrupted_metrics(tmp_path):
    config = TrainConfig(method="clip-higher", **{**MICRO, "steps": 5, "save_every": 2})
    whole = read_metrics_after(run, config, tmp_path / "whole")
    # interrupted after step 3: checkpoint at step 2 (save_every), line 3 written after it
    parts = tmp_path / "parts"
    run(config, parts, max_steps=2, progress=False)
    with (parts / METRICS_FILE).open("a") as handle:  # a line written after the last checkpoint
        handle.write(json.dumps({"step": 3, "reward": -1.0}) + "\n")
    run(config, parts, resume=True, progress=False)
    resumed = read_metrics(parts / METRICS_FILE)
    assert [line["step"] for line in resumed] == list(range(6))  # nothing lost, nothing duplicated
    assert _without_timing(resumed) == _without_timing(whole)


def test_resume_without_a_checkpoint_changes_nothing(tmp_path):
    config = TrainConfig(method="clip", **MICRO)
    run(config, tmp_path, max_steps=1, progress=False)
    (tmp_path / CHECKPOINT_FILE).unlink()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert set(before) == {METRICS_FILE, "warmup.pt"}
    with pytest.raises(ValueError, match=r"resume: .* has no checkpoint\.pt to resume from; its metrics\.jsonl, "
                                         r"warmup\.pt stay untouched \(pass --new-run"):
        run(config, tmp_path, resume=True, progress=False)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    with pytest.raises(ValueError, match=r"already holds metrics\.jsonl, warmup\.pt; pass --resume"):
        run(config, tmp_path, progress=False)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    lines = run(config, tmp_path, resume=True, new_run=True, progress=False)  # explicit: a new run
    assert [line["step"] for line in read_metrics(tmp_path / METRICS_FILE)] == list(range(MICRO["steps"] + 1))
    assert len(lines) == MICRO["steps"]


def read_metrics_after(function, config, out):
    function(config, out, progress=False)
    return read_metrics(out / METRICS_FILE)


def test_resume_refuses_a_different_configuration(tmp_path):
    config = TrainConfig(method="clip", **MICRO)
    run(config, tmp_path, max_steps=1, progress=False)
    with pytest.raises(ValueError, match="resume: lr differs from the checkpoint"):
        run(TrainConfig(method="clip", **{**MICRO, "lr": 1e-4}), tmp_path, resume=True, progress=False)
    with pytest.raises(ValueError, match=r"already holds metrics\.jsonl"):
        run(config, tmp_path, progress=False)


def test_warm_start_reproduces_the_run_that_warmed_up(tmp_path):
    config = TrainConfig(method="band", **MICRO)
    own = run(config, tmp_path / "own", progress=False)
    started = run(config, tmp_path / "started", warm_start=tmp_path / "own" / "warmup.pt", progress=False)
    assert _without_timing(own) == _without_timing(started)
    with pytest.raises(ValueError, match="warm_start: seed differs"):
        run(TrainConfig(method="band", **{**MICRO, "seed": 5}), tmp_path / "x",
            warm_start=tmp_path / "own" / "warmup.pt", progress=False)


def test_a_local_hugging_face_model_directory(tmp_path):
    config = TrainConfig(method="clip", **MICRO)
    policy = build_tiny_policy(config.make_task().symbols, seed=3)
    policy.save(tmp_path / "model")
    lines = run(TrainConfig(method="clip", model=str(tmp_path / "model"), **MICRO), tmp_path / "run",
                progress=False)
    assert len(lines) == MICRO["steps"]
    with pytest.raises(ValueError, match=r"model: .* is not a local directory"):
        run(TrainConfig(model=str(tmp_path / "missing"), **MICRO), tmp_path / "run2", progress=False)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"group_size": 1}, "group_size: must be an integer >= 2"),
        ({"minibatches": 3}, "minibatches: must divide the batch"),
        ({"lr": -1.0}, "lr: must be a finite number > 0, got -1.0"),
        ({"size": "huge"}, "size: unknown model size 'huge'"),
        ({"task": "sort"}, "task: unknown task 'sort'"),
        ({"steps": 0}, "steps: must be a positive integer, got 0"),
    ],
)
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kwargs)


def _train_parser() -> argparse.ArgumentParser:
    parser = build_parser("train")
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["train"]


HAND_WRITTEN = {"--out", "--compare", "--sweep", "--quick", "--seeds", "--resume", "--new-run", "--max-steps",
                "--no-progress", "--threads", "-h", "--help", "--debug"}


def test_every_config_field_is_an_option_generated_from_the_dataclass():
    options = {opt: action for action in _train_parser()._actions for opt in action.option_strings}
    generated = set()
    for field in dataclasses.fields(TrainConfig):
        flag = "--" + field.name.replace("_", "-")
        action = options[flag]
        generated.add(flag)
        assert action.dest == field.name and action.default is argparse.SUPPRESS
        assert field.metadata["help"] in action.help and f"(default: {field.default})" in action.help
        choices = field.metadata["choices"]
        assert (list(action.choices) if action.choices else None) == (list(choices) if choices else None), flag
    assert "--max-grad-norm" in generated and "--loss-agg-mode" in generated
    assert set(options) == HAND_WRITTEN | generated


def test_generated_options_reach_the_config():
    from experiments.toy.cli import _given

    args = build_parser("train").parse_args(
        ["train", "--out", "x", "--max-grad-norm", "0.5", "--clip-eps-high", "none", "--loss-agg-mode",
         "seq-mean-token-sum", "--divergence", "hellinger", "--eval-every", "3"])
    given = _given(args)
    assert given == {"max_grad_norm": 0.5, "clip_eps_high": None, "loss_agg_mode": "seq-mean-token-sum",
                     "divergence": "hellinger", "eval_every": 3}
    config = TrainConfig(**given)
    assert (config.max_grad_norm, config.eval_every, config.steps) == (0.5, 3, TrainConfig().steps)


def _cli_micro() -> list[str]:
    args = []
    for key, value in MICRO.items():
        args += ["--" + key.replace("_", "-"), str(value)]
    return args


def test_cli_train_and_its_errors(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["train", "--out", out, "--method", "band", "--no-progress", *_cli_micro()]) == 0
    assert "final: reward" in capsys.readouterr().out
    assert main(["train", "--out", out, "--no-progress", *_cli_micro()]) == 2
    assert "already holds metrics.jsonl" in capsys.readouterr().err
    assert main(["train", "--out", str(tmp_path / "q"), "--quick"]) == 2
    assert "--quick only applies to --compare" in capsys.readouterr().err


def test_compare_on_a_micro_budget_writes_summary_and_plots(tmp_path, capsys):
    out = tmp_path / "cmp"
    micro = _cli_micro()
    assert main(["train", "--compare", "--out", str(out), "--seeds", "2", "--no-progress", *micro]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["methods"]) == {"clip", "clip-higher", "band-kl"}
    for entry in summary["methods"].values():
        for key in ("reward", "entropy", "pass_at_k"):
            assert set(entry[key]) == {"n", "mean", "std", "se", "ci", "ci_half_width", "per_seed"}
            assert len(entry[key]["per_seed"]) == 2
    assert "band_cost_frac" in summary["methods"]["band-kl"]
    for key in ("reward_auc", "reward_early", "reward_mid", "reward_late", "entropy_early", "entropy_late"):
        assert len(summary["methods"]["clip"][key]["per_seed"]) == 2, key
    assert summary["paired"]["reference"] == "clip" and set(summary["paired"]) == {"reference", "clip-higher",
                                                                                     "band-kl"}
    assert summary["regime"]["updates_per_batch"] == MICRO["ppo_epochs"] * MICRO["minibatches"]
    assert 0.0 < summary["regime"]["start_answer_prob"] <= summary["regime"]["start_first_token_prob"]
    # identical starts: every method's step-0 line (the warmed-up policy) is the same for a seed
    starts = {name: read_metrics(out / "runs" / name / "seed0" / METRICS_FILE)[0] for name in summary["methods"]}
    assert len({json.dumps({k: v for k, v in s.items() if k not in TIMING_FIELDS}) for s in starts.values()}) == 1
    for stem in ("reward", "entropy", "clipfrac"):
        assert (out / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert printed.startswith((out / "summary.md").read_text()) and "| band-kl − clip |" in printed
    # --resume keeps the finished runs
    before = (out / "runs" / "clip" / "seed0" / METRICS_FILE).read_text()
    assert main(["train", "--compare", "--resume", "--out", str(out), "--seeds", "2", "--no-progress", *micro]) == 0
    assert (out / "runs" / "clip" / "seed0" / METRICS_FILE).read_text() == before
    # without --resume or --new-run an existing comparison is refused before any run starts
    files = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["train", "--compare", "--out", str(out), "--seeds", "2", "--no-progress", *micro]) == 2
    assert "already holds a comparison (summary.json, summary.md, reward.png" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == files
    with pytest.raises(ValueError, match="set per method"):
        compare(tmp_path / "bad", overrides={"method": "band"}, seeds=1)


def _synthetic_run(rewards, entropies, final, rare_low=0.0):
    lines = [{"step": 0, "eval_reward": 0.1, "eval_entropy": 0.5, "eval_pass_at_k": 0.2, "eval_accuracy": 0.1,
              "eval_fork_frac": 0.4, "eval_answer_prob": 0.05, "eval_first_token_prob": 0.1}]
    for step, (reward, entropy) in enumerate(zip(rewards, entropies, strict=True), start=1):
        lines.append({"step": step, "reward": reward, "entropy": entropy, "clipfrac": 0.1,
                      "final_abs_log_ratio": 0.2, "token_frac/p<0.01": 0.1 * step, "clipfrac_low/p<0.01": rare_low,
                      "clipfrac_high/p<0.01": 0.0, "final_log_ratio_neg/p<0.01": -rare_low * step})
    lines[-1].update({"eval_reward": final, "eval_entropy": 0.3, "eval_pass_at_k": 0.9, "eval_accuracy": final})
    return lines


def test_summary_curve_metrics_and_paired_differences_by_hand():
    entropy = [0.6, 0.5, 0.4, 0.3, 0.2, 0.1]
    runs = {
        "clip": [_synthetic_run([0, 0, 0.5, 0.5, 1, 1], entropy, 0.9, rare_low=0.2),
                 _synthetic_run([0, 0, 0, 0, 0.5, 0.5], entropy, 0.5, rare_low=0.4)],
        "band-kl": [_synthetic_run([0.5, 0.5, 1, 1, 1, 1], entropy, 0.95),
                    _synthetic_run([0, 0.5, 0.5, 0.5, 0.5, 1], entropy, 0.6)],
    }
    summary = summarise(runs, TrainConfig(**MICRO), seeds=2)
    band, clip = summary["methods"]["band-kl"], summary["methods"]["clip"]
    assert clip["reward_auc"]["per_seed"] == pytest.approx([0.5, 1 / 6])
    assert band["reward_auc"]["per_seed"] == pytest.approx([5 / 6, 0.5])
    # thirds of six steps: steps 1-2, 3-4, 5-6
    assert clip["reward_early"]["per_seed"] == [0.0, 0.0] and band["reward_early"]["per_seed"] == [0.5, 0.25]
    assert clip["reward_late"]["per_seed"] == [1.0, 0.5]
    assert clip["entropy_mid"]["mean"] == pytest.approx(0.35)
    paired = summary["paired"]["band-kl"]["reward_auc"]
    assert paired["per_seed"] == pytest.approx([1 / 3, 1 / 3]) and paired["ahead"] == 2
    assert paired["t"] is None  # identical differences: no spread, no t statistic
    final = summary["paired"]["band-kl"]["reward"]
    assert final["mean"] == pytest.approx(0.075) and final["t"] == pytest.approx(3.0)  # 0.075 / (0.0354 / √2)
    assert summary["regime"]["start_answer_prob"] == 0.05
    assert summary["regime"]["abs_log_ratio"]["clip"] == pytest.approx(0.2)
    # rare tokens: a constant clip fraction per run; log r of rare tokens with A < 0 averaged over the steps
    assert clip["clip_low_rare"]["per_seed"] == pytest.approx([0.2, 0.4])
    assert clip["log_ratio_neg_rare"]["per_seed"] == pytest.approx([-0.2 * 3.5, -0.4 * 3.5])
    assert summary["paired"]["band-kl"]["clip_low_rare"]["per_seed"] == pytest.approx([-0.2, -0.4])
    assert "clip_low_common" not in clip  # no step had a common token
    table = render_markdown(summary)
    assert "| clip | 0.300 ± " in table and "| band-kl − clip | -0.300 [" in table


def _comparable(summary):
    """A summary without what measures wall-clock time or names the output directory."""
    methods = {name: {k: v for k, v in entry.items() if k != "band_cost_frac"}
               for name, entry in summary["methods"].items()}
    return {**{k: v for k, v in summary.items() if k not in ("wall_time_s", "command")}, "methods": methods}


def test_compare_quick_on_a_tiny_budget_gives_intervals_tables_and_identical_reruns(tmp_path, capsys):
    micro = [*_cli_micro(), "--steps", "3"]
    for name in ("a", "b"):
        assert main(["train", "--compare", "--quick", "--out", str(tmp_path / name), "--seeds", "2",
                     "--no-progress", *micro]) == 0
    capsys.readouterr()
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    # the quick budget, overridden by the options: its regime's demo_correct stays, the steps are ours
    assert summary["config"]["demo_correct"] == 0.03 and summary["config"]["steps"] == 3
    assert summary["seeds"] == 2 and summary["ci_level"] == 0.95
    assert summary["determinism"] == {"seeds": [0, 1], "torch_threads": 1, "deterministic_algorithms": "strict",
                                      "torch_version": torch.__version__}
    # the recorded command reproduces the comparison: it parses to the same options
    from experiments.toy.cli import _given

    words = summary["command"].split()
    assert words[:3] == ["bandcore", "train", "--compare"]
    typed = build_parser("train").parse_args(["train", "--compare", "--quick", "--out", str(tmp_path / "a"),
                                              "--seeds", "2", *micro])
    recorded = build_parser("train").parse_args(words[1:])
    assert (recorded.quick, recorded.seeds, recorded.out, _given(recorded)) == (True, 2, str(tmp_path / "a"),
                                                                                  _given(typed))
    t = t_quantile(0.95, 1)
    for name, entry in summary["methods"].items():
        for key in ("reward", "pass_at_k", "entropy", "reward_auc"):
            stat = entry[key]
            values = stat["per_seed"]
            assert stat["mean"] == pytest.approx(sum(values) / 2)
            assert stat["se"] == pytest.approx(abs(values[0] - values[1]) / 2)  # s/sqrt(2) with n = 2
            assert stat["ci_half_width"] == pytest.approx(t * stat["se"])
            low, high = stat["ci"]
            assert low <= stat["mean"] <= high, (name, key)
    paired = summary["paired"]
    assert paired["reference"] == "clip" and "clip" not in paired  # no difference of clip against itself
    for name in ("clip-higher", "band-kl"):
        for key in ("reward", "pass_at_k", "entropy", "reward_auc"):
            diff = paired[name][key]
            own, ref = summary["methods"][name][key]["per_seed"], summary["methods"]["clip"][key]["per_seed"]
            assert diff["per_seed"] == pytest.approx([a - b for a, b in zip(own, ref, strict=True)])
            assert diff["ahead"] == sum(a > b for a, b in zip(own, ref, strict=True))
            if diff["ci"] is not None:
                assert diff["ci"][0] <= diff["mean"] <= diff["ci"][1]
    # summary.md: the command, one row per method with mean ± half-width, one row per paired difference
    table = (tmp_path / "a" / "summary.md").read_text()
    assert table.startswith(f"`{summary['command']}`")
    reward = summary["methods"]["band-kl"]["reward"]
    assert f"| band-kl | {reward['mean']:.3f} ± {reward['ci_half_width']:.3f} |" in table
    assert "| band-kl − clip |" in table and "| clip-higher − clip |" in table and "| clip − clip |" not in table
    # two identical runs of the comparison: identical numbers (wall-clock fields aside)
    other = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert _comparable(summary) == _comparable(other)
    assert table.splitlines()[1:] == (tmp_path / "b" / "summary.md").read_text().splitlines()[1:]


def test_bucket_metrics_by_hand():
    # one sequence of four tokens, old probabilities 0.005 / 0.05 / 0.3 / 0.9 (one per bucket), A = -1
    old = torch.log(torch.tensor([[0.005, 0.05, 0.3, 0.9], [0.005, 0.05, 0.3, 0.9]]))
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    advantages = torch.tensor([-1.0, 2.0])
    bucket = bucket_masks(old, mask)
    assert bucket.sum(dim=(1, 2)).tolist() == [2.0, 2.0, 1.0, 1.0]
    log_ratio = torch.tensor([[-3.0, -0.1, -0.5, 0.0], [1.0, 0.5, 9.0, 9.0]])
    lower, upper = torch.full_like(old, -0.2), torch.full_like(old, 0.2)
    counts = clipped_by_bucket(log_ratio, advantages, lower, upper, bucket)
    # below: A < 0 and log r < -0.2 -> row 0 tokens 0 (p<0.01) and 2 (p 0.1-0.5); above: A > 0 and log r > 0.2
    # -> row 1 tokens 0 and 1 (tokens 2, 3 are masked)
    assert counts.tolist() == [[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]]
    metrics = bucket_metrics(bucket, counts * 2, 2, log_ratio * mask, advantages)  # two passes, same clips
    assert metrics["token_frac/p<0.01"] == pytest.approx(2 / 6) and metrics["token_frac/p>=0.5"] == pytest.approx(1 / 6)
    assert metrics["clipfrac_low/p<0.01"] == 0.5 and metrics["clipfrac_high/p<0.01"] == 0.5
    assert metrics["clipfrac_low/p0.1-0.5"] == 1.0 and metrics["clipfrac_high/p0.01-0.1"] == 0.5
    assert metrics["final_log_ratio_neg/p<0.01"] == -3.0 and metrics["final_log_ratio_pos/p<0.01"] == 1.0
    assert "final_log_ratio_pos/p>=0.5" not in metrics  # the masked token with A > 0 does not count
