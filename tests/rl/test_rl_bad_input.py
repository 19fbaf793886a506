"""Bad input to the RL loss and the trainer: one row per case, the exact error type and a message fragment.

Also the defined results at the edges of the domain (log p in (0, 1e-6] read as 0, log p = -inf dropped from
the surrogate) and the protection of run directories (``--resume`` / ``--new-run``).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from bandcore.cli import main
from bandcore.rl import band_policy_loss, log_ratio_bounds, per_token_policy_loss
from experiments.toy.config import TrainConfig

B, T = 2, 3
F64 = torch.float64


def _batch():
    old = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.6, 0.1]], dtype=F64))
    log_prob = old + torch.tensor([[0.1, -0.2, 0.05], [0.3, -0.1, 0.0]], dtype=F64)
    advantages = torch.tensor([1.0, -0.5], dtype=F64)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    return log_prob, old, advantages, mask


def _set(tensor: torch.Tensor, index, value) -> torch.Tensor:
    tensor = tensor.clone()
    tensor[index] = value
    return tensor


def _full(value: float) -> torch.Tensor:
    return torch.full((B, T), value, dtype=F64)


def _with_bounds(lower: torch.Tensor, upper: torch.Tensor):
    return lambda lp, o, a, m, kw: (lp, o, a, m, {"log_bounds": (lower, upper)})


# each row: (edit of (log_prob, old, advantages, mask, kwargs), error type, message fragment)
LOSS_CASES = {
    "old_log_prob shape": (lambda lp, o, a, m, kw: (lp, o[:, :2], a, m, kw), ValueError,
                           r"old_log_prob must have the shape of log_prob \(2, 3\), got \(2, 2\)"),
    "mask shape": (lambda lp, o, a, m, kw: (lp, o, a, m.T, kw), ValueError,
                   r"mask must have the shape of log_prob \(2, 3\), got \(3, 2\)"),
    "advantages (B+1,)": (lambda lp, o, a, m, kw: (lp, o, torch.ones(3, dtype=F64), m, kw), ValueError,
                          r"advantages must have shape \(B,\), \(B, 1\) or \(B, T\) with \(B, T\) = \(2, 3\) the "
                          r"shape of log_prob, got \(3,\)"),
    "advantages (B, T+1)": (lambda lp, o, a, m, kw: (lp, o, torch.ones(2, 4, dtype=F64), m, kw), ValueError,
                            r"advantages must have shape .* got \(2, 4\)"),
    "log_prob 1-d": (lambda lp, o, a, m, kw: (lp.reshape(-1), o.reshape(-1), a, m.reshape(-1), kw), ValueError,
                     r"log_prob must have shape \(B, T\), got shape \(6,\)"),
    "mask complex": (lambda lp, o, a, m, kw: (lp, o, a, m.to(torch.complex64), kw), TypeError,
                     r"mask must be a bool, integer or floating-point tensor"),
    "old log p = +5": (lambda lp, o, a, m, kw: (lp, _set(o, (0, 1), 5.0), a, m, kw), ValueError,
                       r"old_log_prob must be <= 0 at unmasked tokens .* got 1 value\(s\) above, e.g. "
                       r"old_log_prob=5\.0"),
    "old log p = 2e-6": (lambda lp, o, a, m, kw: (lp, _set(o, (1, 0), 2e-6), a, m, kw), ValueError,
                         r"up to 1e-06 is read as 0\), got 1 value\(s\) above, e.g. old_log_prob=2e-06"),
    "old log p = +inf": (lambda lp, o, a, m, kw: (lp, _set(o, (0, 0), math.inf), a, m, kw), ValueError,
                         r"old_log_prob must be <= 0 at unmasked tokens"),
    "mask NaN": (lambda lp, o, a, m, kw: (lp, o, a, _set(m.double(), (1, 2), math.nan), kw), ValueError,
                 r"mask must not hold NaN, got 1 NaN value\(s\)"),
    "mask negative float": (lambda lp, o, a, m, kw: (lp, o, a, _set(m.double(), (0, 0), -1.0), kw), ValueError,
                            r"mask must be >= 0 \(token weights\), got 1 negative value\(s\), e.g. mask=-1\.0"),
    "mask negative int": (lambda lp, o, a, m, kw: (lp, o, a, _set(m.long(), (1, 2), -2), kw), ValueError,
                          r"mask must be >= 0 .* mask=-2"),
    "advantage NaN": (lambda lp, o, a, m, kw: (lp, o, _set(a, 0, math.nan), m, kw), ValueError,
                      r"advantages must be finite at unmasked tokens, got 3 non-finite value\(s\), e.g. "
                      r"advantages=nan"),
    "advantage -inf per token": (lambda lp, o, a, m, kw: (lp, o, _set(a[:, None].expand(B, T).clone(), (1, 1),
                                                                       -math.inf), m, kw), ValueError,
                                 r"advantages must be finite at unmasked tokens, got 1 .* advantages=-inf"),
    "log_bounds lower > upper": (_with_bounds(_full(0.1), _full(0.0)), ValueError,
                                 r"log_bounds must have lower <= upper at unmasked tokens, got lower > upper in "
                                 r"5 token\(s\), e.g. \(0\.1, 0\.0\)"),
    "log_bounds NaN": (_with_bounds(_set(_full(-0.2), (0, 2), math.nan), _full(0.2)), ValueError,
                       r"log_bounds must not be NaN at unmasked tokens, got NaN in 1 token\(s\)"),
    "log_bounds shape": (_with_bounds(_full(0.0)[:, :2], _full(0.0)[:, :2]), ValueError,
                         r"log_bounds must be two tensors of shape \(2, 3\) \(the shape of log_prob\), "
                         r"got \[\(2, 2\), \(2, 2\)\]"),
    "log_bounds not a pair": (lambda lp, o, a, m, kw: (lp, o, a, m, {"log_bounds": _full(0.0)}), TypeError,
                              r"log_bounds must be a pair \(log_lower, log_upper\) of tensors"),
    "log_bounds integer": (_with_bounds(_full(0.0).long(), _full(0.0).long()), TypeError,
                           r"log_bounds must be floating-point tensors"),
}


@pytest.mark.parametrize("case", list(LOSS_CASES))
@pytest.mark.parametrize("function", [band_policy_loss, per_token_policy_loss])
def test_bad_loss_inputs_are_named(case, function):
    edit, error, match = LOSS_CASES[case]
    log_prob, old, adv, mask, kwargs = edit(*_batch(), {})
    with pytest.raises(error, match=match):
        function(log_prob, old, adv, mask, **kwargs)


def test_padding_is_not_checked():
    """Masked positions may hold anything: values beyond the contract there raise nothing."""
    log_prob, old, adv, mask = _batch()
    old = _set(old, (1, 2), 7.0)
    adv = _set(adv[:, None].expand(B, T).clone(), (1, 2), math.nan)
    bounds = (_set(torch.zeros(B, T, dtype=F64), (1, 2), 1.0), torch.zeros(B, T, dtype=F64))
    loss, _ = band_policy_loss(log_prob, old, adv, mask, log_bounds=bounds)
    assert torch.isfinite(loss)


def test_check_false_skips_the_value_checks():
    log_prob, old, adv, mask = _batch()
    loss, _ = band_policy_loss(log_prob, _set(old, (0, 1), 5.0), adv, mask, check=False)
    assert torch.isnan(loss)  # log p above the tolerance: NaN bounds, never a silent clamp
    loss, _ = band_policy_loss(log_prob, _set(old, (0, 1), 5.0), adv, mask, method="clip", check=False)
    assert torch.isnan(loss)
    with pytest.raises(ValueError, match="old_log_prob must have the shape"):  # structure is always checked
        band_policy_loss(log_prob, old[:, :2], adv, mask, check=False)


@pytest.mark.parametrize("method", ["band", "clip"])
def test_log_p_up_to_the_tolerance_is_read_as_zero(method):
    log_prob, old, adv, mask = _batch()
    x = log_prob.clone().requires_grad_()
    at_zero, m0 = band_policy_loss(x, _set(old, (0, 2), 0.0), adv, mask, method=method)
    (g0,) = torch.autograd.grad(at_zero, x)
    y = log_prob.clone().requires_grad_()
    noisy, m1 = band_policy_loss(y, _set(old, (0, 2), 1e-6), adv, mask, method=method)
    (g1,) = torch.autograd.grad(noisy, y)
    assert torch.equal(at_zero, noisy) and torch.equal(g0, g1)
    assert all(torch.equal(m0[k], m1[k]) for k in m0)


def test_log_ratio_bounds_tolerance():
    old = torch.tensor([-0.5, 1e-6, 3e-6], dtype=F64)
    for method in ("band", "clip", "clip-higher"):
        with pytest.raises(ValueError, match=r"old_log_prob must be <= 0 .* old_log_prob=3e-06"):
            log_ratio_bounds(old, method=method)
        lower, upper = log_ratio_bounds(old, method=method, check=False)
        assert torch.isnan(lower[2]) and torch.isnan(upper[2]), method
        assert not torch.isnan(lower[:2]).any() and not torch.isnan(upper[:2]).any(), method
    with pytest.raises(TypeError, match="old_log_prob must be a floating-point tensor"):
        log_ratio_bounds(torch.zeros(3, dtype=torch.long))


# ---------------------------------------------------------------------------------------------------------
# log p = -inf at an unmasked token: dropped from the surrogate (loss and gradient exactly 0 there)
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["band", "clip"])
@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_minus_infinite_old_log_prob_is_dropped_exactly(method, sign, mode):
    old = torch.log(torch.tensor([[0.5, 0.0, 0.2], [0.4, 0.3, 0.0]], dtype=F64))  # two log p = -inf
    assert old[0, 1] == -math.inf and old[1, 2] == -math.inf
    new = torch.log(torch.tensor([[0.55, 0.3, 0.18], [0.41, 0.28, 0.2]], dtype=F64))
    adv = torch.tensor([sign, -sign], dtype=F64)
    mask = torch.tensor([[True, True, True], [True, True, True]])
    x = new.clone().requires_grad_()
    loss, metrics = band_policy_loss(x, old, adv, mask, method=method, dual_clip=3.0, loss_agg_mode=mode)
    (grad,) = torch.autograd.grad(loss, x)
    # the reference: the same batch with those two tokens' per-token loss set to 0, the mask unchanged
    finite = torch.isfinite(old)
    y = new.clone().requires_grad_()
    safe_old = torch.where(finite, old, 0.0)
    per_token, _ = per_token_policy_loss(torch.where(finite, y, 0.0), safe_old, adv, mask, method=method,
                                         dual_clip=3.0)
    from bandcore.rl import aggregate_loss

    expected = aggregate_loss(torch.where(finite, per_token, 0.0), mask, mode)
    (expected_grad,) = torch.autograd.grad(expected, y)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    torch.testing.assert_close(loss, expected, rtol=1e-15, atol=0)
    assert torch.equal(grad, expected_grad)
    assert grad[0, 1] == 0 and grad[1, 2] == 0 and grad[0, 0] != 0
    pg, _ = per_token_policy_loss(new, old, adv, mask, method=method, dual_clip=3.0)
    assert pg[0, 1] == 0 and pg[1, 2] == 0
    # metrics: counted as clipped above; left out of the means of log r, r and u - l
    assert all(torch.isfinite(v) for v in metrics.values())
    _, finite_metrics = band_policy_loss(new, safe_old, adv, mask & finite, method=method, dual_clip=3.0)
    for key in ("approx_kl", "approx_kl_k3", "ratio_mean", "band_width"):
        torch.testing.assert_close(metrics[key], finite_metrics[key], rtol=1e-14, atol=0)
    expected_high = (finite_metrics["clipfrac_high"] * 4 + 2) / 6
    torch.testing.assert_close(metrics["clipfrac_high"], expected_high, rtol=1e-14, atol=0)
    torch.testing.assert_close(metrics["clipfrac_high_fixed"], (finite_metrics["clipfrac_high_fixed"] * 4 + 2) / 6,
                               rtol=1e-14, atol=0)


def test_minus_infinite_old_log_prob_with_precomputed_bounds():
    old = torch.tensor([[-0.7, -math.inf]], dtype=F64)
    new = torch.tensor([[-0.6, -1.0]], dtype=F64, requires_grad=True)
    bounds = log_ratio_bounds(old)
    assert bounds[0][0, 1] == -math.inf and bounds[1][0, 1] == math.inf  # the Band of p = 0
    loss, _ = band_policy_loss(new, old, torch.tensor([1.0], dtype=F64), torch.ones(1, 2), log_bounds=bounds)
    (grad,) = torch.autograd.grad(loss, new)
    assert torch.isfinite(loss) and grad[0, 1] == 0 and grad[0, 0] != 0


# ---------------------------------------------------------------------------------------------------------
# The trainer's configuration: every field is checked, by name, when the config is built
# ---------------------------------------------------------------------------------------------------------

CONFIG_CASES = [
    ({"method": "ppo"}, ValueError, r"method: unknown method 'ppo'; choose one of"),
    ({"divergence": "no-such-divergence"}, ValueError, r"divergence: .*no-such-divergence"),
    ({"divergence": 3}, TypeError, r"divergence: must be a string, got 3"),
    ({"delta": 0.0}, ValueError, r"delta: must be a finite number > 0, got 0\.0"),
    ({"delta": math.nan}, ValueError, r"delta: must be a finite number, got nan"),
    ({"delta": 1e9}, ValueError, r"delta"),
    ({"delta": "0.1"}, TypeError, r"delta: must be a real number, got '0\.1'"),
    ({"clip_eps": 1.0}, ValueError, r"clip_eps: must be a finite number in \(0, 1\), got 1\.0"),
    ({"clip_eps_high": 0.0}, ValueError, r"clip_eps_high: must be a finite number > 0, got 0\.0"),
    ({"dual_clip": 1.0}, ValueError, r"dual_clip: must be a finite number > 1, got 1\.0"),
    ({"max_ratio": 0.5}, ValueError, r"max_ratio: must be a finite number > 1, got 0\.5"),
    ({"loss_agg_mode": "mean"}, ValueError, r"loss_agg_mode: unknown loss_agg_mode 'mean'"),
    ({"task": "sort"}, ValueError, r"task: unknown task 'sort'"),
    ({"reward": "partial"}, ValueError, r"reward: unknown reward 'partial'"),
    ({"task": "add", "digits": 9}, ValueError, r"digits: must be in \[1, 8\] for task 'add', got 9"),
    ({"digits": 1}, ValueError, r"digits: must be in \[2, 16\] for task 'reverse', got 1"),
    ({"base": 11}, ValueError, r"base: must be an integer in \[2, 10\], got 11"),
    ({"demo_correct": 1.5}, ValueError, r"demo_correct: must be a number in \[0, 1\], got 1\.5"),
    ({"demo_correct": 0.6, "demo_noise": 0.5}, ValueError, r"demo_correct \+ demo_noise: must be <= 1"),
    ({"size": "huge"}, ValueError, r"size: unknown model size 'huge'"),
    ({"model": "/no/such/model/dir"}, ValueError, r"model: '/no/such/model/dir' is not a local directory"),
    ({"steps": 0}, ValueError, r"steps: must be a positive integer, got 0"),
    ({"steps": 2.5}, TypeError, r"steps: must be an integer, got 2\.5 \(float\)"),
    ({"steps": True}, TypeError, r"steps: must be an integer, got True \(bool\)"),
    ({"group_size": 1}, ValueError, r"group_size: must be an integer >= 2, got 1"),
    ({"minibatches": 3}, ValueError, r"minibatches: must divide the batch prompts_per_step\*group_size = 64"),
    ({"lr": -1.0}, ValueError, r"lr: must be a finite number > 0, got -1\.0"),
    ({"lr": None}, TypeError, r"lr: must be given \(not None\)"),
    ({"max_grad_norm": 0.0}, ValueError, r"max_grad_norm: must be a finite number > 0, got 0\.0"),
    ({"temperature": math.inf}, ValueError, r"temperature: must be a finite number, got inf"),
    ({"warmup_steps": -1}, ValueError, r"warmup_steps: must be a non-negative integer, got -1"),
    ({"warmup_lr": 0}, ValueError, r"warmup_lr: must be a finite number > 0, got 0\.0"),
    ({"eval_k": 0}, ValueError, r"eval_k: must be a positive integer, got 0"),
    ({"seed": -3}, ValueError, r"seed: must be a non-negative integer, got -3"),
    ({"device": "gpu0"}, ValueError, r"device: 'gpu0' is not a torch device"),
    pytest.param({"device": "cuda"}, ValueError, r"device: 'cuda' is not available on this machine",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), CONFIG_CASES)
def test_bad_train_config_is_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        TrainConfig(**kwargs)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--delta", "0"], "delta: must be a finite number > 0"),
        (["--divergence", "no-such-divergence"], "divergence:"),
        (["--digits", "40"], "digits: must be in [2, 16] for task 'reverse'"),
        (["--max-grad-norm", "-1"], "max_grad_norm: must be a finite number > 0"),
        (["--clip-eps-high", "0"], "clip_eps_high: must be a finite number > 0"),
        (["--threads", "0"], "threads: must be a positive integer"),
        (["--max-steps", "0"], "max_steps: must be a positive integer"),
        (["--seeds", "2"], "seeds: --seeds only applies to --compare"),
        (["--compare", "--max-steps", "3"], "max_steps: --max-steps does not apply to --compare"),
    ],
)
def test_cli_refuses_bad_settings_before_any_work(tmp_path, capsys, argv, fragment):
    out = tmp_path / "never"
    assert main(["train", "--out", str(out), "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()  # nothing was created, no warm-up ran


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--method", "ppo"], "argument --method: invalid choice: 'ppo'"),
        (["--steps", "x"], "argument --steps: invalid int value: 'x'"),
        (["--delta", "big"], "argument --delta: invalid float value: 'big'"),
        (["--see", "1"], "unrecognized arguments: --see"),  # no abbreviations: --seed and --seeds both exist
    ],
)
def test_cli_refuses_malformed_options(tmp_path, capsys, argv, fragment):
    assert main(["train", "--out", str(tmp_path / "never"), *argv]) == 2
    assert fragment in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------
# Run directories are never overwritten by accident
# ---------------------------------------------------------------------------------------------------------

MICRO = ["--steps", "1", "--warmup-steps", "2", "--habit-steps", "1", "--warmup-batch", "8", "--prompts-per-step",
         "2", "--group-size", "2", "--ppo-epochs", "1", "--minibatches", "1", "--eval-prompts", "2", "--eval-k", "2",
         "--no-progress"]


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize(
    ("files", "argv", "fragment"),
    [
        (("metrics.jsonl",), ["--resume"], "resume: '{out}' has no checkpoint.pt to resume from; its metrics.jsonl "
                                           "stay untouched (pass --new-run"),
        (("metrics.jsonl", "warmup.pt"), ["--resume"], "its metrics.jsonl, warmup.pt stay untouched"),
        ((), ["--resume"], "resume: '{out}' has no checkpoint.pt to resume from (pass --new-run"),
        (("metrics.jsonl",), [], "out: '{out}' already holds metrics.jsonl; pass --resume to continue that run, "
                                 "--new-run to overwrite it"),
        (("checkpoint.pt",), [], "already holds checkpoint.pt"),
    ],
)
def test_a_run_directory_is_not_overwritten_without_new_run(tmp_path, capsys, files, argv, fragment):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    for name in files:
        (out / name).write_text(f"precious {name}\n")
    before = _snapshot(out)
    assert main(["train", "--out", str(out), *MICRO, *argv]) == 2
    assert fragment.format(out=out) in capsys.readouterr().err
    assert _snapshot(out) == before


@pytest.mark.parametrize("argv", [["--new-run"], ["--resume", "--new-run"]])
def test_new_run_overwrites_explicitly(tmp_path, capsys, argv):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 0, "old": true}\n')
    assert main(["train", "--out", str(out), *MICRO, *argv]) == 0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and '"old"' not in lines[0]
    assert (out / "checkpoint.pt").exists()
    # now there is a checkpoint: --resume continues it (and --new-run does not force a restart)
    capsys.readouterr()
    assert main(["train", "--out", str(out), *MICRO, "--steps", "2", "--resume", "--new-run"]) == 0
    assert [line.split(",")[0] for line in (out / "metrics.jsonl").read_text().splitlines()] == [
        '{"step": 0', '{"step": 1', '{"step": 2']
