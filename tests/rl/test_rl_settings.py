"""BandSettings (the plug-ins' one settings class), the radius schedules, the KL controller, the bounds provider."""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bandcore import band_log
from bandcore.rl import log_ratio_bounds
from bandcore.rl.provider import BandBounds
from bandcore.rl.schedule import KLController, scheduled_delta, used_delta
from bandcore.rl.settings import BandSettings
from bandcore.tables import BandTable

ROOT = Path(__file__).resolve().parents[2]


def test_the_settings_layer_imports_no_torch():
    """Host-neutral: an adapter for a JAX or NumPy trainer can build on settings, schedule and provider."""
    code = ("import sys; import bandcore.rl.settings, bandcore.rl.schedule, bandcore.rl.provider; "
            "s = bandcore.rl.settings.BandSettings(divergence='kl', delta_schedule='linear', delta_end=0.02, "
            "delta_steps=10).bounds_provider(); import numpy as np; s.log_bounds(np.log([0.5, 0.01])); "
            "print(sorted(m for m in ('torch', 'trl', 'verl', 'jax') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------------------
# Validation: one place, the host's key in every message
# ---------------------------------------------------------------------------------------------------------

BAD = [
    ({"delta": 0.0}, ValueError, "band_delta must be a finite number > 0, got 0.0"),
    ({"delta_low": -0.1}, ValueError, "band_delta_low must be a finite number > 0, got -0.1"),
    ({"delta_high": float("nan")}, ValueError, "band_delta_high must be a finite number > 0, got nan"),
    ({"delta": 0.1, "delta_high": 0.2}, ValueError, "band_delta=0.1 sets both radii but band_delta_high=0.2"),
    ({"divergence": "no-such"}, ValueError, "band_divergence 'no-such'"),
    ({"divergence": 3}, TypeError, "band_divergence must be a divergence name"),
    ({"method": "ppo"}, ValueError, r"band_method must be one of \('band', 'clip', 'clip-higher'\), got 'ppo'"),
    ({"loss_form": "cispo"}, ValueError, r"band_loss_form must be one of \('clip', 'dppo'\), got 'cispo'"),
    ({"delta_schedule": "step"}, ValueError, r"band_delta_schedule must be one of \('constant', 'linear', "
                                             r"'cosine', 'exponential'\), got 'step'"),
    ({"delta_schedule": "linear"}, ValueError, "band_delta_schedule='linear' needs band_delta_end and "
                                               "band_delta_steps"),
    ({"delta_schedule": "linear", "delta_end": 0.02, "delta_steps": 0}, ValueError,
     "band_delta_steps must be >= 1, got band_delta_steps=0"),
    ({"delta_schedule": "cosine", "delta_end": 0.02, "delta_steps": 2.5}, TypeError,
     "band_delta_steps must be an integer"),
    ({"delta_schedule": "linear", "delta_end": 0.0, "delta_steps": 5}, ValueError,
     "band_delta_end must be a finite number > 0"),
    ({"delta_schedule": "linear", "delta_end": 0.02, "delta_steps": 5, "delta_hold_steps": -1}, ValueError,
     "band_delta_hold_steps must be >= 0"),
    ({"delta_end": 0.02}, ValueError, "band_delta_end=0.02 is unused with band_delta_schedule='constant'"),
    ({"delta_steps": 10}, ValueError, "band_delta_steps=10 is unused with band_delta_schedule='constant'"),
    ({"target_kl": 0.0}, ValueError, "band_target_kl must be a finite number > 0, got 0.0"),
    ({"target_kl": 0.01, "kl_rate": 2.0}, ValueError, "band_kl_rate must be in"),
    ({"target_kl": 0.01, "delta": 0.5}, ValueError, "band_delta_min <= band_delta <= band_delta_max"),
    ({"target_kl": 0.01, "delta_min": 0.1, "delta_max": 0.05, "delta": 0.07}, ValueError,
     "band_delta_min <= band_delta <= band_delta_max is needed by the controller"),
    ({"delta_min": 0.2, "delta_max": 0.1}, ValueError, "band_delta_min must be < band_delta_max"),
    ({"target_kl": 0.01, "delta_schedule": "linear", "delta_end": 0.02, "delta_steps": 5}, ValueError,
     "band_target_kl .* and band_delta_schedule='linear' both move the radius"),
    ({"target_kl": 0.01, "delta_low": 0.02, "delta_high": 0.05}, ValueError,
     "band_target_kl moves one radius of the Band: it needs band_method='band' and band_delta_low == band_delta_high"),
    ({"delta_schedule": "linear", "delta_end": 0.02, "delta_steps": 5, "method": "clip"}, ValueError,
     "moves one radius of the Band: it needs band_method='band'"),
    ({"anchor": "new"}, ValueError, r"band_anchor must be one of \('old', 'rollout'\), got 'new'"),
    ({"allow_on_policy": "yes"}, TypeError, "band_allow_on_policy must be True or False, got 'yes'"),
    ({"check": 1}, TypeError, "band_check must be True or False, got 1"),
    ({"max_ratio": 1.0}, ValueError, "band_max_ratio must be a finite number > 1, got 1.0"),
    ({"dual_clip": 0.5}, ValueError, "band_dual_clip must be a finite number > 1, got 0.5"),
    ({"loss_form": "dppo", "dual_clip": 3.0}, ValueError, "band_dual_clip=3.0 applies to band_loss_form='clip'"),
    ({"clip_ratio_c": 5.0}, ValueError, "band_clip_ratio_c=5.0 is the truncation of band_loss_form='dppo'"),
    ({"clip_eps": 1.2}, ValueError, r"band_clip_eps must be in \(0, 1\), got 1.2"),
    ({"divergence": "renyi(2)", "delta": 10.0}, ValueError, "renyi"),
]


@pytest.mark.parametrize(("values", "error", "match"), BAD)
def test_bad_settings_name_the_hosts_key(values, error, match):
    with pytest.raises(error, match=match):
        BandSettings(**values, key_prefix="band_")


def test_host_key_names_replace_the_prefix_in_messages():
    with pytest.raises(ValueError, match=r"clip_ratio_c must be a finite number > 1, got 0\.5"):
        BandSettings(loss_form="dppo", clip_ratio_c=0.5, key_prefix="band_", key_names=(("clip_ratio_c",
                                                                                         "clip_ratio_c"),))


def test_radii():
    assert BandSettings().radii == (0.05, 0.05)
    assert BandSettings(delta=0.1).radii == (0.1, 0.1)
    assert BandSettings(delta_low=0.02).radii == (0.02, 0.05)
    assert BandSettings(delta_low=0.02, delta_high=0.08).radii == (0.02, 0.08)
    assert BandSettings(delta=0.08, delta_high=0.08, delta_low=0.08).radii == (0.08, 0.08)
    assert BandSettings(loss_form="dppo").truncation == 20.0
    assert BandSettings(loss_form="dppo", clip_ratio_c=10).truncation == 10.0


def test_from_host_reads_prefixed_keys_from_objects_and_mappings():
    class Host:
        band_divergence, band_delta, band_loss_form, epsilon = "tv", 0.1, "dppo", 0.3

    from_object = BandSettings.from_host(Host(), names={"clip_eps": "epsilon"})
    from_mapping = BandSettings.from_host({"band_divergence": "tv", "band_delta": 0.1, "band_loss_form": "dppo",
                                           "epsilon": 0.3}, names={"clip_eps": "epsilon"})
    assert from_object == from_mapping == BandSettings(divergence="tv", delta=0.1, loss_form="dppo", clip_eps=0.3)
    with pytest.raises(ValueError, match="epsilon must be in"):
        BandSettings.from_host({"epsilon": 1.5}, names={"clip_eps": "epsilon"})


def test_the_on_policy_rule():
    settings = BandSettings(key_prefix="band_")
    with pytest.raises(ValueError, match=r"the ratio is always 1 with ppo_epochs=1, so the Band never acts; .* set "
                                         r"band_allow_on_policy=True"):
        settings.check_on_policy(True, "ppo_epochs=1")
    settings.check_on_policy(False, "ppo_epochs=2")
    BandSettings(allow_on_policy=True).check_on_policy(True, "ppo_epochs=1")
    BandSettings(anchor="rollout").check_on_policy(True, "ppo_epochs=1")  # the rollout policy differs anyway


# ---------------------------------------------------------------------------------------------------------
# Schedules and the controller
# ---------------------------------------------------------------------------------------------------------


def test_schedules_by_hand():
    for name in ("linear", "cosine", "exponential"):
        values = [scheduled_delta(name, t, 0.2, 0.02, 10, hold=3) for t in range(20)]
        assert values[:4] == [0.2] * 4 and values[13:] == [0.02] * 7, name
        assert all(a >= b for a, b in itertools.pairwise(values)), name
    assert scheduled_delta("linear", 8, 0.2, 0.02, 10, hold=3) == pytest.approx(0.2 - 0.18 * 0.5)
    assert scheduled_delta("cosine", 8, 0.2, 0.02, 10, hold=3) == pytest.approx(0.11)
    assert scheduled_delta("exponential", 8, 0.2, 0.02, 10, hold=3) == pytest.approx(0.2 * 0.1**0.5)
    assert scheduled_delta("linear", 5, 0.02, 0.2, 10) == pytest.approx(0.11)  # growing works too
    assert scheduled_delta("constant", 99, 0.05) == 0.05


def test_used_delta_is_three_significant_digits():
    assert used_delta(0.0537123) == 0.0537 and used_delta(0.2) == 0.2 and used_delta(0.123456) == 0.123


def test_controller_is_monotone_bounded_and_still_at_target():
    kls = np.geomspace(1e-6, 10, 200)
    for start in (0.01, 0.05, 0.2):
        moved = []
        for kl in kls:
            c = KLController(start, target_kl=0.01, rate=0.3, delta_min=0.01, delta_max=0.2)
            moved.append(c.update(float(kl)))
        assert all(a >= b for a, b in itertools.pairwise(moved))  # non-increasing in the measured KL
        assert all(0.01 <= d <= 0.2 for d in moved)
        assert max(moved) <= min(0.2, start * math.exp(0.3)) * (1 + 1e-15)
        assert min(moved) >= max(0.01, start * math.exp(-0.3)) * (1 - 1e-15)
    for kl in (1e-4, 0.01, 0.5):  # non-decreasing in the previous delta
        after = [KLController(d, 0.01, 0.3, 0.01, 0.2).update(kl) for d in np.linspace(0.01, 0.2, 50)]
        assert all(a <= b for a, b in itertools.pairwise(after))
    c = KLController(0.05, 0.01, 0.3, 0.01, 0.2)
    assert c.update(0.01) == 0.05 and c.update(0.0) == 0.05  # at target, and no information: still
    assert c.update(0.02) == pytest.approx(0.05 * math.exp(-0.3 * math.log(2)))
    with pytest.raises(ValueError, match="measured KL must be a number >= 0, got nan"):
        c.update(math.nan)


def test_controller_converges_on_a_policy_whose_kl_grows_with_delta():
    """A stand-in for training: the measured KL is proportional to delta; delta settles where KL = target."""
    c = KLController(0.2, target_kl=0.01, rate=0.2, delta_min=0.01, delta_max=0.2)
    for _ in range(200):
        c.update(0.2 * c.delta)  # KL = target at delta = 0.05
    assert c.delta == pytest.approx(0.05, rel=1e-6)


# ---------------------------------------------------------------------------------------------------------
# The bounds provider
# ---------------------------------------------------------------------------------------------------------

OLD = torch.log(torch.tensor([[1e-6, 0.003, 0.08, 0.4, 0.93, 1.0]], dtype=torch.float64))


def test_a_constant_radius_uses_the_exact_solver():
    provider = BandSettings(divergence="hellinger", delta_low=0.03, delta_high=0.07, max_ratio=4).bounds_provider()
    want = log_ratio_bounds(OLD, divergence="hellinger", delta_low=0.03, delta_high=0.07, max_ratio=4)
    got = provider.log_bounds(OLD)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert provider.table is None and provider.metrics() == {"delta_low": 0.03, "delta_high": 0.07}


@pytest.mark.parametrize("divergence", ["kl", "tv", "js"])
def test_a_moving_radius_reads_the_shipped_2d_table_inside_its_range(divergence):
    settings = BandSettings(divergence=divergence, delta=0.2, delta_schedule="linear", delta_end=0.005,
                            delta_steps=100)
    provider = settings.bounds_provider()
    table = BandTable.shipped(divergence, (0.01, 0.2))
    assert provider.table is not None and provider.table.delta_range == (0.01, 0.2)
    for step in (0, 37, 96, 200):
        provider.set_step(step)
        delta = provider.delta
        assert delta == used_delta(settings.delta + (0.005 - settings.delta) * min(1, step / 100))
        got = provider.log_bounds(OLD)
        exact = band_log(OLD, divergence, delta)
        if 0.01 <= delta <= 0.2:
            want = table.log(OLD, delta)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
            for g, e in zip(got, exact, strict=True):  # within the table's certificate of the exact Band
                finite = torch.isfinite(e)
                assert torch.equal(torch.isfinite(g), finite)
                err = (g[finite] - e[finite]).abs() / e[finite].abs().clamp_min(1.0)
                assert float(err.max()) <= table.max_rel_error
        else:
            assert torch.equal(got[0], exact[0]) and torch.equal(got[1], exact[1])
    assert provider.metrics() == {"delta": 0.005}


def test_a_moving_radius_without_a_shipped_table_uses_the_exact_solver():
    provider = BandSettings(divergence="alpha(0.3)", target_kl=0.01, delta=0.05).bounds_provider()
    assert provider.table is None
    provider.record_kl(0.04)
    delta = provider.delta
    assert delta == used_delta(0.05 * math.exp(-0.1)) and delta != 0.05
    got, want = provider.log_bounds(OLD), band_log(OLD, "alpha(0.3)", delta)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_a_transforms_moving_radius_is_mapped():
    provider = BandSettings(divergence="renyi(2)", delta=0.05, delta_schedule="exponential", delta_end=0.02,
                            delta_steps=4).bounds_provider()
    provider.advance(2)
    delta = provider.delta
    got, want = provider.log_bounds(OLD), band_log(OLD, "renyi(2)", delta)
    for g, w in zip(got, want, strict=True):  # Pearson's shipped table at the mapped radius: within 1e-6
        finite = torch.isfinite(w)
        assert torch.equal(torch.isfinite(g), finite)
        assert float(((g - w)[finite]).abs().max()) < 1e-6


def test_provider_takes_numpy_and_keeps_torch_dtype_and_fixed_clips():
    provider = BandSettings(method="clip-higher", clip_eps=0.2, max_ratio=1.25).bounds_provider()
    lower, upper = provider.log_bounds(np.log([0.5, 0.1]))
    assert isinstance(lower, np.ndarray)
    assert np.allclose(lower, math.log(0.8)) and np.allclose(upper, math.log(1.25))
    lower32, _ = provider.log_bounds(OLD.float())
    assert lower32.dtype == torch.float32 and provider.metrics() == {}
    band = BandSettings().bounds_provider()
    assert band.log_bounds(OLD.float())[1].dtype == torch.float32
    with pytest.raises(ValueError, match="step must be >= 0"):
        band.set_step(-1)
    with pytest.raises(TypeError, match="settings must be a BandSettings"):
        BandBounds({"delta": 0.05})
