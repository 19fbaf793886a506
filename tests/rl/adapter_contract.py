"""The contract every trainer plug-in of the Band passes: a reusable test template (docs/rl.md, "Writing a plug-in").

An adapter's test module writes a small *driver* for its host (the methods and attributes of :class:`Driver`) and
calls each ``check_*`` function below with it, typically from one parametrised test::

    from adapter_contract import CHECKS

    @pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
    def test_contract(check, driver):
        check(driver)

The checks use only the host's own loss and bandcore's reference functions, never a copy of the host's code:

- :func:`check_fixed_clip_equals_host`: with ``method="clip"`` the plug-in computes the host's own loss (loss,
  gradient and the host's clip metrics), so baselines run through the same code;
- :func:`check_band_is_ppo_clip_at_band_bounds`: with the Band (one-sided radii included) it is PPO's clip at
  the Band's bounds, computed separately by :func:`bandcore.band_log` and :func:`bandcore.rl.band_policy_loss`;
- :func:`check_dppo_form`: ``loss_form="dppo"`` equals :func:`band_policy_loss` with ``loss_form="dppo"``;
- :func:`check_metric_names`: the host's metric names, and the radius in use under the host's name for it;
- :func:`check_bad_keys_are_named`: each bad setting is refused when the host's config is built, with an error
  that names the host's key.

This file is a helper, not a test module (pytest collects ``test_*.py`` only); tests in this folder import it by
name (pytest puts the folder of a test module without ``__init__.py`` on ``sys.path``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

import pytest
import torch

from bandcore import band_log
from bandcore.rl import band_policy_loss

__all__ = [
    "BAD_SETTINGS",
    "CHECKS",
    "Driver",
    "Run",
    "check_bad_keys_are_named",
    "check_band_is_ppo_clip_at_band_bounds",
    "check_dppo_form",
    "check_fixed_clip_equals_host",
    "check_metric_names",
]


@dataclass
class Run:
    """One call of a loss: the scalar loss (with its graph), the tensors its gradient is compared over, and the
    metrics the host logs for that call (name -> float)."""

    loss: torch.Tensor
    leaves: list[torch.Tensor]
    metrics: dict[str, float]


class Driver(Protocol):
    """What a host's test provides.  ``settings`` are :class:`bandcore.rl.settings.BandSettings` field names
    (``delta``, ``loss_form``, ...): the driver spells them as its host does (``band_delta``)."""

    #: how the host spells a settings field in its config and errors, e.g. {"delta": "band_delta"}
    keys: dict[str, str]
    #: metric names the plug-in must log on every call (the host's own and the Band's)
    metric_names: tuple[str, ...]
    #: the host's names of the radius in use: (symmetric, lower, upper), e.g. ("band/delta", ...)
    delta_metrics: tuple[str, str, str]
    #: host metric -> the same quantity under the host's own loss, equal under a fixed clip
    shared_metrics: tuple[str, ...]
    #: relative tolerance of loss and gradients (1e-12 for fp64 hosts; fp32 hosts need more)
    rtol: float

    def batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(old_log_prob, advantages, mask) of the batch every run uses."""

    def log_prob(self) -> torch.Tensor:
        """The current policy's (B, T) log-probabilities, with a fresh graph over the run's leaves."""

    def plugin(self, **settings: Any) -> Run:
        """The plug-in's loss on the batch with these settings."""

    def host(self) -> Run:
        """The host's own loss on the batch with its own fixed clip (the one ``method="clip"`` reads)."""

    def reference_kwargs(self, **settings: Any) -> dict[str, Any]:
        """:func:`band_policy_loss` arguments that reproduce the host's aggregation (``loss_agg_mode``,
        ``norm_length``) and its dual clip or truncation for these settings."""

    def build(self, **settings: Any) -> None:
        """Build the host's configuration with these settings (raises on a bad one)."""


def _grads(run: Run) -> list[torch.Tensor]:
    return list(torch.autograd.grad(run.loss, run.leaves, allow_unused=False))


def _assert_same(got: Run, want_loss: torch.Tensor, want_grads: list[torch.Tensor], rtol: float, what: str) -> None:
    torch.testing.assert_close(got.loss.detach(), want_loss.detach().to(got.loss.dtype), rtol=rtol, atol=0,
                               msg=lambda m: f"{what}: loss differs: {m}")
    for index, (g, w) in enumerate(zip(_grads(got), want_grads, strict=True)):
        scale = float(w.abs().max()) if w.numel() else 0.0
        torch.testing.assert_close(g, w.to(g.dtype), rtol=rtol, atol=rtol * scale,
                                   msg=lambda m, i=index: f"{what}: gradient {i} differs: {m}")


def _reference(driver: Driver, run: Run, **kwargs: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
    old, adv, mask = driver.batch()
    loss, _ = band_policy_loss(driver.log_prob(), old, adv, mask, **kwargs)
    return loss, list(torch.autograd.grad(loss, run.leaves))


def check_fixed_clip_equals_host(driver: Driver) -> None:
    """``method="clip"``: the host's own loss, gradient and clip metrics."""
    ours, theirs = driver.plugin(method="clip"), driver.host()
    _assert_same(ours, theirs.loss, _grads(theirs), driver.rtol, "method='clip' vs the host's own loss")
    for name in driver.shared_metrics:
        assert ours.metrics[name] == pytest.approx(theirs.metrics[name], rel=1e-6, abs=1e-9), name
    assert any(theirs.metrics[name] > 0 for name in driver.shared_metrics), "the fixed clip never acts on the batch"


def check_band_is_ppo_clip_at_band_bounds(driver: Driver, divergence: str = "kl") -> None:
    """The Band: PPO's clip at the bounds ``band_log`` gives, for one radius and for one-sided radii."""
    old, _, _ = driver.batch()
    for low, high in ((0.05, 0.05), (0.02, 0.1)):
        settings = {"divergence": divergence, "delta_low": low, "delta_high": high}
        run = driver.plugin(**settings)
        bounds = (band_log(old.detach(), divergence, low)[0], band_log(old.detach(), divergence, high)[1])
        loss, grads = _reference(driver, run, log_bounds=bounds, **driver.reference_kwargs(**settings))
        _assert_same(run, loss, grads, driver.rtol, f"the Band of {divergence} at radii ({low}, {high})")


def check_dppo_form(driver: Driver, divergence: str = "tv") -> None:
    """``loss_form="dppo"``: band_policy_loss's dppo form (DPPO's masked truncated importance sampling)."""
    settings = {"divergence": divergence, "delta": 0.05, "loss_form": "dppo"}
    run = driver.plugin(**settings)
    loss, grads = _reference(driver, run, divergence=divergence, delta=0.05, loss_form="dppo",
                             **driver.reference_kwargs(**settings))
    _assert_same(run, loss, grads, driver.rtol, f"the dppo form of {divergence}")


def check_metric_names(driver: Driver) -> None:
    """The host's names of the clip metrics and of the radius in use (one δ, or both one-sided radii)."""
    symmetric, lower, upper = driver.delta_metrics
    metrics = driver.plugin(delta=0.07).metrics
    missing = [name for name in driver.metric_names if name not in metrics]
    assert not missing, f"metrics missing: {missing} (logged: {sorted(metrics)})"
    assert metrics[symmetric] == 0.07 and lower not in metrics
    one_sided = driver.plugin(delta_low=0.03, delta_high=0.08).metrics
    assert (one_sided[lower], one_sided[upper]) == (0.03, 0.08) and symmetric not in one_sided


#: settings -> a fragment of the error (besides the host's key of the first field, which the check requires)
BAD_SETTINGS = [
    ({"delta": 0.0}, "> 0"),
    ({"delta_low": -0.01}, "> 0"),
    ({"delta_high": float("inf")}, "finite"),
    ({"delta": 0.05, "delta_low": 0.02}, "sets both radii"),
    ({"divergence": "no-such-divergence"}, "no-such-divergence"),
    ({"method": "ppo"}, "must be one of"),
    ({"loss_form": "sapo"}, "must be one of"),
    ({"delta_schedule": "step"}, "must be one of"),
    ({"delta_steps": 0, "delta_schedule": "linear", "delta_end": 0.01}, ">= 1"),
    ({"target_kl": -1.0}, "> 0"),
    ({"anchor": "reference"}, "must be one of"),
    ({"max_ratio": 0.5}, "> 1"),
]


def check_bad_keys_are_named(driver: Driver) -> None:
    """Every bad setting is refused when the host's config is built, naming the host's key."""
    for settings, fragment in BAD_SETTINGS:
        key = driver.keys[next(iter(settings))]
        with pytest.raises((ValueError, TypeError)) as caught:
            driver.build(**settings)
        message = str(caught.value)
        assert re.search(rf"\b{re.escape(key)}\b", message) and fragment in message, (settings, message)


CHECKS = (check_fixed_clip_equals_host, check_band_is_ppo_clip_at_band_bounds, check_dppo_form,
          check_metric_names, check_bad_keys_are_named)
