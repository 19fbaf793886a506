"""The Tunix plug-in (bandcore.rl.tunix): Tunix's GRPO loss with the Band's per-token bounds, on the CPU.

The reference is the clipped surrogate of ``tunix/rl/algo_core.py``'s ``grpo_loss_fn`` re-derived here in NumPy
(ratio of the log-probabilities clamped to ±20, clip to [l, u], dual clip, sequence-mean-token-mean), with the
Band from bandcore's NumPy reader; then a real GRPOLearner run (examples/tunix_grpo.py) with the registered loss.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("tunix")
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402
from tunix.rl import common, function_registry  # noqa: E402
from tunix.rl.grpo.grpo_learner import TrainExample  # noqa: E402
from tunix.tests import test_common as toys  # noqa: E402

from bandcore import BandTable  # noqa: E402
from bandcore.rl import tunix as band_tunix  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tunix_grpo.py"


def _example():
    spec = importlib.util.spec_from_file_location("tunix_grpo_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _batch(shift: float, squeeze: float = 1.0, seed: int = 0):
    """A toy model, a batch of 4 completions (the last padded), advantages of both signs, and old log-probs: the
    model's own minus ``shift`` on even tokens (ratio e^shift) and ``squeeze`` times its own on odd ones (the old
    policy gave them more mass: ratio p^(1 - squeeze) < 1), so that both bounds can clip."""
    vocab = toys.MockVocab()
    model = toys.ToyTransformer(config=toys.ModelConfig(vocab_size=vocab.GetPieceSize()), rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    prompt = jnp.asarray(rng.integers(3, 20, (4, 3)), dtype=jnp.int32)
    completion = jnp.asarray(rng.integers(3, 20, (4, 6)), dtype=jnp.int32)
    mask = np.ones((4, 6), dtype=np.int32)
    mask[3, 4:] = 0
    graphdef, state = nnx.split(model)
    logps = np.asarray(common.compute_per_token_logps(graphdef, state, prompt_tokens=prompt,
                                                      completion_tokens=completion, pad_id=0, eos_id=2))  # fmt: skip
    even = np.arange(6) % 2 == 0
    old = np.where(even, logps - shift, squeeze * logps)
    old = np.where(mask > 0, old, 3.0)  # padding may hold anything (here log p > 0, which the Band refuses)
    example = TrainExample(prompt_ids=prompt, prompt_mask=jnp.ones_like(prompt), completion_ids=completion,
                           completion_mask=jnp.asarray(mask), advantages=jnp.asarray([1.5, -2.0, 0.7, -0.4]),
                           ref_per_token_logps=None,
                           old_per_token_logps=jnp.asarray(old, dtype=jnp.float32))  # fmt: skip
    return model, example, logps, old, mask


def _reference(logps, old, mask, adv, lower, upper, dual):
    """algo_core.grpo_loss_fn's surrogate in NumPy: (loss, clipped fraction)."""
    ratio = np.exp(np.clip(logps - old, -20.0, 20.0))
    a = adv[:, None]
    unclipped, clipped = -a * ratio, -a * np.clip(ratio, lower, upper)
    per_token = np.maximum(unclipped, clipped)
    if dual is not None:
        per_token = np.where(a < 0, np.minimum(per_token, -dual * a), per_token)
    seq = (per_token * mask).sum(-1) / np.maximum(mask.sum(-1), 1)
    return seq.sum() / max((mask.sum(-1) > 0).sum(), 1), ((clipped > unclipped) * mask).sum() / mask.sum()


@pytest.mark.parametrize(("divergence", "delta", "max_ratio", "dual"),
                         [("kl", 0.05, None, None), ("tv", 0.1, 10.0, 10.0), ("js", 0.02, 3.0, 4.0)])  # fmt: skip
def test_loss_is_tunix_surrogate_at_the_band(divergence, delta, max_ratio, dual):
    model, example, logps, old, mask = _batch(shift=2.0, squeeze=0.2)
    config = band_tunix.BandGRPOConfig(num_generations=2, beta=0.0, band_divergence=divergence, band_delta=delta,
                                       band_max_ratio=max_ratio, epsilon_c=dual)  # fmt: skip
    config.temperature = 1.0  # (the learner sets it from the rollout config)
    loss_fn = function_registry.get_policy_loss_fn("band_grpo")
    assert loss_fn is band_tunix.band_grpo_loss_fn
    loss, aux = jax.jit(lambda m, ex: loss_fn(m, ex, config, 0, 2))(model, example)
    lower, upper = BandTable.shipped(divergence, delta)(np.where(mask > 0, old, 0.0).astype(np.float64))
    if max_ratio is not None:
        upper = np.minimum(upper, max_ratio)
    lower, upper = np.where(mask > 0, lower, 1.0), np.where(mask > 0, upper, 1.0)
    ref_loss, ref_clipfrac = _reference(logps.astype(np.float64), old, mask, np.asarray(example.advantages),
                                        lower, upper, dual)  # fmt: skip
    assert ref_clipfrac > 0  # the shifted tokens leave the Band
    np.testing.assert_allclose(float(loss), ref_loss, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(float(aux["pg_clipfrac"]), ref_clipfrac, atol=1e-6)
    np.testing.assert_allclose(float(aux["band/width_mean"]), ((upper - lower) * mask).sum() / mask.sum(), rtol=1e-5)


def test_band_clips_rare_tokens_less_than_a_fixed_clip():
    """Same batch, Tunix's own GRPO loss with PPO's ε = 0.2 clips more tokens than the KL Band at δ = 0.05 on a
    2-fold shift (ratios 2: inside the Band of rare tokens, outside [0.8, 1.2])."""
    model, example, *_ = _batch(shift=float(np.log(2.0)))
    band = band_tunix.BandGRPOConfig(num_generations=2, beta=0.0)
    band.temperature = 1.0
    fixed = band_tunix.GRPOConfig(num_generations=2, beta=0.0, epsilon=0.2)
    fixed.temperature = 1.0
    _, aux_band = band_tunix.band_grpo_loss_fn(model, example, band, 0, 2)
    _, aux_fixed = function_registry.get_policy_loss_fn("grpo")(model, example, fixed, 0, 2)
    assert float(aux_fixed["pg_clipfrac"]) > float(aux_band["pg_clipfrac"])


def test_bounds_are_the_tables():
    config = band_tunix.BandGRPOConfig(num_generations=2, band_divergence="hellinger", band_delta_low=0.02,
                                       band_delta_high=0.13)  # fmt: skip
    lp = np.log(np.array([1e-4, 0.01, 0.3, 0.9, 0.999]))
    lower, upper = band_tunix.band_bounds(config, jnp.asarray(lp, dtype=jnp.float32))
    ref_lower = BandTable.shipped("hellinger", 0.02)(lp.astype(np.float32))[0]
    ref_upper = BandTable.shipped("hellinger", (0.01, 0.2))(lp.astype(np.float32), 0.13)[1]  # not a 1-D δ
    np.testing.assert_allclose(np.asarray(lower), ref_lower, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(upper), ref_upper, rtol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"band_divergence": "nonsense(u"}, ValueError, "band_divergence"),
        ({"band_delta": 0.0}, ValueError, "band_delta"),
        ({"band_delta": "0.05"}, TypeError, "band_delta must be a real number"),
        ({"band_delta_high": -1.0}, ValueError, "band_delta_high"),
        ({"band_max_ratio": 1.0}, ValueError, "band_max_ratio"),
        ({"epsilon_c": float("nan")}, ValueError, "epsilon_c"),
        ({"band_table": 3}, TypeError, "band_table"),
        ({"policy_loss_fn": "grpo"}, ValueError, "policy_loss_fn"),
    ],
)
def test_bad_settings_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        band_tunix.BandGRPOConfig(num_generations=2, **kwargs)


def test_table_must_hold_the_band_asked_for():
    with pytest.raises(ValueError, match="not of 'tv'"):
        band_tunix.BandGRPOConfig(num_generations=2, band_divergence="tv", band_table=BandTable.shipped("kl", 0.05))
    with pytest.raises(ValueError, match=r"delta=0\.1"):
        band_tunix.BandGRPOConfig(num_generations=2, band_delta=0.1, band_table=BandTable.shipped("kl", 0.05))
    two_d = BandTable.shipped("kl", (0.01, 0.2))
    with pytest.raises(ValueError, match="covers delta"):
        band_tunix.BandGRPOConfig(num_generations=2, band_delta=0.3, band_table=two_d)


def test_on_policy_is_refused_unless_allowed_and_other_configs_are_refused():
    """The settings' on-policy rule (BandSettings.check_on_policy), as in every plug-in."""
    with pytest.raises(ValueError, match=r"ratio is always 1 with num_iterations=1 .* band_allow_on_policy=True"):
        band_tunix.BandGRPOConfig(num_generations=2, num_iterations=1)
    config = band_tunix.BandGRPOConfig(num_generations=2, num_iterations=1, band_allow_on_policy=True)
    assert config.band_settings.allow_on_policy
    model, example, *_ = _batch(shift=0.0)
    with pytest.raises(TypeError, match="needs a BandGRPOConfig"):
        band_tunix.band_grpo_loss_fn(model, example, band_tunix.GRPOConfig(num_generations=2), 0, 2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"band_loss_form": "dppo"}, "band_loss_form='dppo' is not supported by the Tunix plug-in"),
        ({"band_delta_schedule": "linear"}, "band_delta_schedule='linear' is not supported .* no optimizer step"),
        ({"band_target_kl": 0.01}, "band_target_kl=0.01 is not supported .* no optimizer step"),
        ({"band_anchor": "rollout"}, "band_anchor='rollout' is not supported .* no rollout-engine"),
        ({"band_method": "ppo"}, "band_method must be one of"),
        ({"band_delta": 0.05, "band_delta_low": 0.02}, "band_delta=0.05 sets both radii"),
        ({"band_loss_form": "sapo"}, "band_loss_form must be one of"),
    ],
)
def test_settings_tunix_cannot_run_are_refused_with_the_reason(kwargs, match):
    with pytest.raises(ValueError, match=match):
        band_tunix.BandGRPOConfig(num_generations=2, **kwargs)


def test_config_holds_the_shared_settings():
    config = band_tunix.BandGRPOConfig(num_generations=2, band_divergence="tv", band_delta_low=0.02,
                                       band_delta_high=0.1, band_max_ratio=5.0, epsilon_c=3.0)  # fmt: skip
    s = config.band_settings
    assert (s.divergence, s.radii, s.max_ratio, s.dual_clip, s.clip_eps) == ("tv", (0.02, 0.1), 5.0, 3.0, 0.2)
    assert (config.radius("low"), config.radius("high")) == (0.02, 0.1)
    assert band_tunix.BandGRPOConfig(num_generations=2).band_settings.radii == (0.05, 0.05)


@pytest.mark.parametrize(("method", "epsilon_high"), [("clip", None), ("clip-higher", None), ("clip", 0.3)])
def test_fixed_clip_is_tunixs_own_grpo_loss(method, epsilon_high):
    """band_method clip / clip-higher: Tunix's registered "grpo" loss with its own scalar clip, bit for bit."""
    model, example, *_ = _batch(shift=0.5, squeeze=0.6)
    ours = band_tunix.BandGRPOConfig(num_generations=2, beta=0.0, band_method=method, epsilon=0.2)
    theirs = band_tunix.GRPOConfig(num_generations=2, beta=0.0, epsilon=0.2)
    want_high = epsilon_high if epsilon_high is not None else (0.2 if method == "clip" else 0.28)
    if epsilon_high is not None:
        ours.epsilon_high = epsilon_high
    theirs.epsilon_high = want_high
    ours.temperature = theirs.temperature = 1.0
    loss, aux = band_tunix.band_grpo_loss_fn(model, example, ours, 0, 2)
    want_loss, want_aux = function_registry.get_policy_loss_fn("grpo")(model, example, theirs, 0, 2)
    assert float(want_aux["pg_clipfrac"]) > 0  # the fixed clip acts on this batch
    assert np.array_equal(np.asarray(loss), np.asarray(want_loss))
    for name, value in want_aux.items():
        assert np.array_equal(np.asarray(aux[name]), np.asarray(value)), name


@pytest.mark.slow
# Tunix 0.1.7's learner, rollout and sampler use APIs that jax 0.10 (which flax 0.12, Tunix's dependency, needs)
# deprecates (`with mesh:`, pxla.thread_resources, a sampler-built KV cache): their DeprecationWarnings are Tunix's
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_grpo_learner_trains_with_the_band():
    """examples/tunix_grpo.py: Tunix's GRPOLearner, vanilla rollout, 8 steps (4 generations, each optimised
    twice): the registered loss runs, the Band clips some tokens, and the reward grows."""
    log = _example().main(["--steps", "8", "--lr", "1e-2"])
    assert len(log["loss"]) == 8 and all(np.isfinite(log["loss"]))
    assert max(log["pg_clipfrac"]) > 0
    assert all(w > 0 for w in log["band/width_mean"])
    assert np.mean(log["reward"][-2:]) > log["reward"][0]
