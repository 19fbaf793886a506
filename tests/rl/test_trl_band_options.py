"""The TRL plug-in on the adapter contract, and its dppo form, one-sided radii, radii that move and anchor.

Each check builds a real :class:`trl.GRPOTrainer` (or the plug-in's subclass) on the example's tiny Llama and calls
its ``_compute_loss`` on a hand-built micro-batch, as TRL's training step would (eval mode: no accumulation
normaliser; the model has no dropout).
"""

from __future__ import annotations

import math
from typing import ClassVar

import pytest
import torch
from adapter_contract import CHECKS, Run
from trl import GRPOConfig, GRPOTrainer

from bandcore.rl import band_policy_loss
from bandcore.rl.schedule import scheduled_delta, used_delta
from bandcore.rl.settings import BandSettings
from bandcore.rl.trl import BandGRPOConfig, BandGRPOTrainer

PROMPTS = ["4721=", "1203=", "9981=", "5620="]
COMPLETION_MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]])


class TrlDriver:
    keys: ClassVar[dict[str, str]] = {name: f"band_{name}" for name in BandSettings.__dataclass_fields__}
    metric_names = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "band/clip_ratio/low",
                    "band/clip_ratio/high", "band/clip_ratio/region", "band/width_mean",
                    "band/clip_ratio_fixed/region_mean")
    delta_metrics = ("band/delta", "band/delta_low", "band/delta_high")
    shared_metrics = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")
    rtol = 2e-5  # TRL's log-probabilities are fp32

    def __init__(self, example, tmp_path, seed: int = 1) -> None:
        self.example, self.tmp_path = example, tmp_path
        self.task = example.make_task("reverse")
        self.tokenizer = example.build_tokenizer(self.task)
        self.inputs = self._inputs(seed)
        self.model = None

    def _base(self, **overrides):
        return {"output_dir": str(self.tmp_path), "num_iterations": 2, "per_device_train_batch_size": 4,
                "num_generations": 2, "max_completion_length": 5, "beta": 0.0, "loss_type": "bnpo", "epsilon": 0.2,
                "epsilon_high": 0.28, **self.example.cpu_settings(), **overrides}

    def _new_model(self):
        return self.example.build_model(self.tokenizer, seed=0)

    def _inputs(self, seed):
        gen = torch.Generator().manual_seed(seed)
        prompt_ids = torch.tensor(self.tokenizer(PROMPTS)["input_ids"])
        completion_ids = torch.randint(len(self.example.SPECIAL_TOKENS), len(self.tokenizer), (4, 5), generator=gen)
        self.prompt_ids, self.completion_ids = prompt_ids, completion_ids
        self.model = self._new_model()
        with torch.no_grad():
            log_prob = self.log_prob()
        old = torch.clamp(log_prob + 1.2 * torch.randn(log_prob.shape, generator=gen), max=-1e-3)
        return {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion_ids,
                "completion_mask": COMPLETION_MASK, "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]),
                "old_per_token_logps": old, "num_items_in_batch": COMPLETION_MASK.sum()}

    def batch(self):
        return self.inputs["old_per_token_logps"], self.inputs["advantages"], self.inputs["completion_mask"]

    def log_prob(self) -> torch.Tensor:
        ids = torch.cat([self.prompt_ids, self.completion_ids], 1)
        attention = torch.cat([torch.ones_like(self.prompt_ids), COMPLETION_MASK], 1)
        logits = self.model(input_ids=ids, attention_mask=attention).logits[:, self.prompt_ids.shape[1] - 1:-1]
        return torch.log_softmax(logits.float(), -1).gather(-1, self.completion_ids[..., None])[..., 0]

    def trainer(self, trainer_class=BandGRPOTrainer, config=None, **settings):
        self.model = self._new_model()
        if config is None:
            loss_type = "cispo" if settings.get("loss_form") == "dppo" else "bnpo"
            config = BandGRPOConfig(**self._base(loss_type=loss_type), **{f"band_{k}": v for k, v in settings.items()})
        trainer = trainer_class(model=self.model, reward_funcs=self.example.digit_match, args=config,
                                train_dataset=self.example.build_dataset(self.task, 16, seed=0),
                                processing_class=self.tokenizer)
        trainer.model.eval()
        return trainer

    def _run(self, trainer, inputs=None) -> Run:
        loss = trainer._compute_loss(trainer.model, dict(self.inputs if inputs is None else inputs))
        metrics = {k: v[-1] for k, v in trainer._metrics["eval"].items()}
        return Run(loss, [p for p in trainer.model.parameters() if p.requires_grad], metrics)

    def plugin(self, **settings) -> Run:
        return self._run(self.trainer(**settings))

    def host(self) -> Run:
        return self._run(self.trainer(GRPOTrainer, config=GRPOConfig(**self._base())))

    def reference_kwargs(self, **settings):
        return {"loss_agg_mode": "token-mean", **({"clip_ratio_c": 20.0} if settings.get("loss_form") == "dppo"
                                                  else {})}

    def build(self, **settings) -> None:
        BandGRPOConfig(**self._base(), **{f"band_{k}": v for k, v in settings.items()})


@pytest.fixture
def driver(trl_example, tmp_path):
    return TrlDriver(trl_example, tmp_path)


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_the_trl_plugin_keeps_the_adapter_contract(check, driver):
    check(driver)


def test_the_dppo_form_runs_through_trls_cispo_and_drops_tokens(driver):
    run = driver.plugin(divergence="kl", delta=0.05, loss_form="dppo", clip_ratio_c=3.0)
    old, adv, mask = driver.batch()
    want, metrics = band_policy_loss(driver.log_prob(), old, adv, mask, delta=0.05, loss_form="dppo",
                                     clip_ratio_c=3.0)
    torch.testing.assert_close(run.loss, want, rtol=2e-5, atol=0)
    assert run.metrics["band/clip_ratio/region"] == pytest.approx(float(metrics["clipfrac"]), abs=1e-6)
    assert run.metrics["band/clip_ratio/high"] > 0 and run.metrics["band/clip_ratio/low"] > 0


# ---------------------------------------------------------------------------------------------------------
# Radii that move: TRL's global_step is the schedule's step; the controller moves at the end of a window
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["linear", "cosine", "exponential"])
def test_the_schedule_follows_trls_global_step(driver, schedule):
    trainer = driver.trainer(delta=0.2, delta_schedule=schedule, delta_end=0.02, delta_steps=10, delta_hold_steps=2)
    old, adv, mask = driver.batch()
    for step in (0, 2, 5, 9, 12, 40):
        trainer.state.global_step = step
        run = driver._run(trainer)
        delta = used_delta(scheduled_delta(schedule, step, 0.2, 0.02, 10, hold=2))
        assert run.metrics["band/delta"] == delta
        bounds = trainer.band_bounds.log_bounds(old)  # the shipped 2-D table at delta
        want, _ = band_policy_loss(driver.log_prob(), old, adv, mask, log_bounds=bounds)
        torch.testing.assert_close(run.loss, want, rtol=2e-5, atol=0)
        exact, _ = band_policy_loss(driver.log_prob(), old, adv, mask, delta=delta)
        torch.testing.assert_close(run.loss, exact, rtol=1e-4, atol=0)  # the table is within 1e-7 of the Band


def test_the_controller_moves_delta_with_the_measured_kl(driver):
    trainer = driver.trainer(delta=0.05, target_kl=0.01, kl_rate=0.5)
    trainer.model.train()  # the controller learns in training only, at the end of each accumulation window
    trainer.current_gradient_accumulation_steps = 1  # what transformers' training_step sets
    old, _, mask = driver.batch()
    with torch.no_grad():
        log_ratio = driver.log_prob() - old
    kl = float(((torch.expm1(log_ratio) - log_ratio) * mask).sum() / mask.sum())
    expected = 0.05
    for _ in range(3):
        trainer._compute_loss(trainer.model, dict(driver.inputs))
        assert trainer._metrics["train"]["band/delta"][-1] == used_delta(expected)
        expected = min(0.2, max(0.01, expected * math.exp(-0.5 * max(-1, min(1, math.log(kl / 0.01))))))
        assert trainer.band_bounds.delta == used_delta(expected)
    trainer.model.eval()
    trainer._compute_loss(trainer.model, dict(driver.inputs))  # evaluation does not move it
    assert trainer.band_bounds.delta == used_delta(expected)


# ---------------------------------------------------------------------------------------------------------
# The anchor: TRL's sampling_per_token_logps (the vLLM engine's log-probabilities)
# ---------------------------------------------------------------------------------------------------------


def _rollout(driver, scale=0.05):
    """The engine's log-probabilities: near the current policy's (the old ones are far from both), one NaN."""
    with torch.no_grad():
        current = driver.log_prob()
    noise = scale * torch.randn(current.shape, generator=torch.Generator().manual_seed(5))
    rollout = torch.clamp(current + noise, max=0.0)
    rollout[1, 1] = math.nan  # vLLM could not give this one: anchored on the old policy
    return rollout


@pytest.mark.parametrize("loss_form", ["clip", "dppo"])
def test_the_rollout_anchor_reads_sampling_per_token_logps(driver, loss_form):
    trainer = driver.trainer(anchor="rollout", loss_form=loss_form)
    old, adv, mask = driver.batch()
    rollout = _rollout(driver)
    run = driver._run(trainer, {**driver.inputs, "sampling_per_token_logps": rollout})
    anchor = torch.where(torch.isnan(rollout), old, rollout)
    want, metrics = band_policy_loss(driver.log_prob(), old, adv, mask, anchor_log_prob=anchor, loss_form=loss_form)
    torch.testing.assert_close(run.loss, want, rtol=2e-5, atol=0)
    assert run.metrics["band/clip_ratio/region"] == pytest.approx(float(metrics["clipfrac"]), abs=1e-6)
    log_prob = driver.log_prob().detach().requires_grad_()
    plain, _ = band_policy_loss(log_prob, old, adv, mask, loss_form=loss_form)
    anchored, _ = band_policy_loss(log_prob, old, adv, mask, anchor_log_prob=anchor, loss_form=loss_form)
    moved = torch.autograd.grad(plain, log_prob)[0] != torch.autograd.grad(anchored, log_prob)[0]
    assert moved.any()  # the anchor changes which tokens keep their gradient on this batch


def test_the_rollout_anchor_acts_on_policy(driver, tmp_path):
    """Without old log-probabilities (on-policy), the ratio to the rollout engine still moves: the Band acts."""
    config = BandGRPOConfig(**driver._base(num_iterations=1), band_anchor="rollout")  # not refused: anchored
    trainer = driver.trainer(config=config)
    _, adv, mask = driver.batch()
    inputs = {k: v for k, v in driver.inputs.items() if k != "old_per_token_logps"}
    rollout = _rollout(driver, scale=0.5)  # the engine's rounding: far enough from the trainer's to be clipped
    run = driver._run(trainer, {**inputs, "sampling_per_token_logps": rollout})
    log_prob = driver.log_prob()
    current = log_prob.detach()
    anchor = torch.where(torch.isnan(rollout), current, rollout)
    want, metrics = band_policy_loss(log_prob, current, adv, mask, anchor_log_prob=anchor)
    torch.testing.assert_close(run.loss, want, rtol=2e-5, atol=0)
    assert float(metrics["clipfrac"]) > 0


def test_the_rollout_anchor_without_rollout_log_probs_names_the_key(driver):
    trainer = driver.trainer(anchor="rollout")
    with pytest.raises(ValueError, match=r"band_anchor='rollout' needs .* sampling_per_token_logps"):
        trainer._compute_loss(trainer.model, dict(driver.inputs))


def test_an_on_policy_batch_in_the_dppo_form_keeps_every_token_at_weight_one(driver):
    """No old log-probabilities: r = 1 is inside every trust region, so the dppo form is -A log pi over all tokens
    (TRL's cispo with its own epsilon_high would weight them by min(1, epsilon_high) instead)."""
    config = BandGRPOConfig(**driver._base(num_iterations=1, loss_type="cispo", epsilon_high=0.2),
                            band_loss_form="dppo", band_allow_on_policy=True)
    trainer = driver.trainer(config=config)
    inputs = {k: v for k, v in driver.inputs.items() if k != "old_per_token_logps"}
    run = driver._run(trainer, inputs)
    _, adv, mask = driver.batch()
    log_prob = driver.log_prob()
    want, _ = band_policy_loss(log_prob, log_prob.detach(), adv, mask, loss_form="dppo")
    torch.testing.assert_close(run.loss, want, rtol=2e-5, atol=0)
    assert trainer.epsilon_high == 0.2  # restored
