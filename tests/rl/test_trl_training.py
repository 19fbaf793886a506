"""BandGRPOTrainer in TRL's own training loop with the default configuration: the Band acts and is logged."""

from __future__ import annotations

import math

import pytest

from bandcore.rl.trl import P_BUCKETS, BandGRPOConfig, BandGRPOTrainer

# transformers 5.x deprecates a property that TRL 1.16 reads at every generation: a third-party warning
TRL_GENERATION_WARNING = "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"



class _RatioRecorder(BandGRPOTrainer):
    """Records, per loss call, the largest |log ratio| over completion tokens (for the test below only)."""

    def _log_band_metrics(self, inputs, state) -> None:
        moved = (state["log_prob"] - state["old"]).abs() * inputs["completion_mask"]
        self.band_log_ratio_max = [*getattr(self, "band_log_ratio_max", []), float(moved.max())]
        super()._log_band_metrics(inputs, state)


@pytest.mark.filterwarnings(TRL_GENERATION_WARNING)
def test_the_default_configuration_moves_the_ratio_and_logs_the_band(trl_example, tmp_path):
    """With BandGRPOConfig's defaults (num_iterations, steps_per_generation, gradient_accumulation_steps unset)
    every batch arrives with old log-probabilities (no on-policy warning: filterwarnings = error), the second
    pass over it, after an optimizer step, sees a ratio different from 1, and every step logs the Band."""
    config = BandGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
                            max_completion_length=5, max_steps=2, logging_steps=1, learning_rate=0.05,
                            **trl_example.cpu_settings())
    assert (config.num_iterations, config.gradient_accumulation_steps, config.steps_per_generation) == (2, 1, 1)
    task = trl_example.make_task("reverse")
    tokenizer = trl_example.build_tokenizer(task)
    trainer = _RatioRecorder(model=trl_example.build_model(tokenizer, seed=0), reward_funcs=trl_example.digit_match,
                             args=config, train_dataset=trl_example.build_dataset(task, 16, seed=0),
                             processing_class=tokenizer)
    trainer.train()
    first_pass, second_pass = trainer.band_log_ratio_max
    assert first_pass < 1e-5 < second_pass  # the same weights, then one optimizer step later
    log = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [(entry["step"], "reward" in entry) for entry in log] == [(1, True), (2, False)]
    for entry in log:
        for key in ("band/clip_ratio/low", "band/clip_ratio/high", "band/clip_ratio/region"):
            assert math.isfinite(entry[key]) and 0 <= entry[key] <= 1, key
        assert math.isfinite(entry["band/width_mean"]) and entry["band/width_mean"] > 0
        assert entry["band/delta"] == 0.05
        buckets = [key for key in entry if key.startswith("band/clip_ratio/p")]
        assert buckets and set(buckets) <= {f"band/clip_ratio/{name}" for name, _, _ in P_BUCKETS}
