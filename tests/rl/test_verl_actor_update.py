"""The Band inside verl 0.9.1's real training step, on the CPU (tests/rl/verl_cpu.py, in a subprocess).

verl's own actor update — ``TrainingWorker.train_mini_batch`` -> ``FSDPEngineWithLMHead.train_batch`` ->
``losses.ppo_loss`` -> the registered loss — with FSDP2 over gloo (world size 1), a 2-layer Llama built from a
config, old log-probabilities from verl's own ``infer_batch``, 2 epochs over one mini-batch, for ``bandpo`` and
verl's ``vanilla`` and ``dppo_kl`` on the same batch:

* with the old log-probabilities the model's own, epoch 1 has ratio 1 everywhere: nothing clips, ``bandpo`` and
  ``vanilla`` have the same loss, and all three losses the same gradient (dppo_kl's surrogate -A·sg(r)·log π has
  the gradient of -A·r), hence the same model in epoch 2, where the ratios moved and the clipped fractions
  differ as the bounds do (the Band of these rare tokens is far wider than [0.8, 1.2]);
* with shifted old log-probabilities (ratio e^3 at one position, e^-2 at another) the clip acts in epoch 1, and
  the loss verl reports is the clipped surrogate at the Band's bounds (BandPO's cap u <= 10) computed here.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("verl")
for _module in ("fastapi", "uvicorn", "peft"):  # what importing verl.workers needs
    pytest.importorskip(_module)

import bandcore as bc  # noqa: E402

HELPER = Path(__file__).resolve().parent / "verl_cpu.py"
ROOT = Path(__file__).resolve().parents[2]
SHIFT = {"0": 3.0, "1": -2.0}
BAND = {"band_divergence": "kl", "band_delta": 0.05, "band_max_ratio": 10.0}
DUAL_CLIP = 3.0  # verl's default clip_ratio_c
#: dppo_kl's binary-KL thresholds (its clip_ratio_*): at p ~ 1/64 a ratio moved by 10 % has a binary KL ~ 1e-4
DPPO_THRESHOLDS = {"clip_ratio_low": 5e-4, "clip_ratio_high": 5e-4}
#: the Band's variants run inside verl's step (a loss-form field joins here when the plug-in has one)
BAND_VARIANTS = [pytest.param({}, id="bandpo")]


def run_verl(runs: list[dict], model_dir: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    spec = json.dumps({"model_dir": str(model_dir), "runs": runs})
    done = subprocess.run([sys.executable, str(HELPER)], input=spec, capture_output=True, text=True, env=env,
                          timeout=900, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def clipped_surrogate(own, old, advantages, mask, lower, upper) -> float:
    """verl's token-mean PPO loss at epoch 1 (the model is the one that gave ``own``): max(-A r, -A clip(r, l, u)),
    then min(., -c A) where A < 0."""
    ratio = np.exp(own - old)
    loss = np.maximum(-advantages * ratio, -advantages * np.clip(ratio, lower, upper))
    loss = np.where(advantages < 0, np.minimum(loss, -DUAL_CLIP * advantages), loss)
    return float((loss * mask).sum() / mask.sum())


@pytest.mark.slow
@pytest.mark.parametrize("variant", BAND_VARIANTS)
def test_band_in_verls_actor_update(tmp_path, variant):
    band = {"loss_mode": "bandpo", "policy_loss": {**BAND, **variant}}
    out = run_verl([
        {"name": "band", **band},
        {"name": "vanilla", "loss_mode": "vanilla"},
        {"name": "dppo_kl", "loss_mode": "dppo_kl", "actor": DPPO_THRESHOLDS},
        {"name": "band_shifted", **band, "shift": SHIFT},
        {"name": "vanilla_shifted", "loss_mode": "vanilla", "shift": SHIFT},
    ], tmp_path / "tiny-llama")  # fmt: skip
    m = {name: run["metrics"] for name, run in out["runs"].items()}
    for name in m:
        assert len(m[name]["actor/pg_loss"]) == 2, name  # two epochs over one mini-batch

    # own old log-probabilities: epoch 1 at ratio 1, identical gradients, identical epoch-2 model
    for name in ("band", "vanilla", "dppo_kl"):
        assert m[name]["actor/pg_clipfrac"][0] == 0.0 and m[name]["actor/ppo_kl"][0] == 0.0, name
    assert m["band"]["actor/pg_loss"][0] == pytest.approx(m["vanilla"]["actor/pg_loss"][0], rel=1e-6)
    for name in ("vanilla", "dppo_kl"):
        assert m[name]["grad_norm"][0] == pytest.approx(m["band"]["grad_norm"][0], rel=1e-5), name
        assert m[name]["actor/ppo_kl"][1] == pytest.approx(m["band"]["actor/ppo_kl"][1], rel=1e-5), name
    assert m["band"]["actor/ppo_kl"][1] != 0.0  # the ratios moved
    # epoch 2: the fixed clip [0.8, 1.2] clips, the Band (wide for p ~ 1/64) clips fewer tokens; the Band's own
    # count of the fixed clip is vanilla's
    assert m["vanilla"]["actor/pg_clipfrac"][1] > m["band"]["actor/pg_clipfrac"][1]
    assert m["band"]["actor/pg_clipfrac_fixed"][1] == pytest.approx(m["vanilla"]["actor/pg_clipfrac"][1], abs=1e-7)
    assert m["dppo_kl"]["actor/pg_clipfrac"][1] != m["band"]["actor/pg_clipfrac"][1]

    # shifted old log-probabilities: the clip acts in epoch 1, at the Band's bounds
    shifted = out["runs"]["band_shifted"]
    own, old = np.array(shifted["own_log_probs"]), np.array(shifted["old_log_probs"])
    advantages, mask = np.array(out["advantages"]), np.array(out["response_mask"], dtype=bool)
    lower, upper = bc.band(np.where(mask, old, -1.0), BAND["band_divergence"], BAND["band_delta"])
    upper = np.minimum(upper, BAND["band_max_ratio"])
    band_shifted, vanilla_shifted = m["band_shifted"], m["vanilla_shifted"]
    assert band_shifted["actor/band_clipfrac_high"][0] > 0 and band_shifted["actor/band_clipfrac_low"][0] > 0
    assert band_shifted["actor/pg_clipfrac"][0] > 0
    if not variant:  # the clip form: verl's loss is the clipped surrogate at the Band's bounds
        expected = clipped_surrogate(own, old, advantages, mask, lower, upper)
        assert band_shifted["actor/pg_loss"][0] == pytest.approx(expected, rel=1e-5)
    assert vanilla_shifted["actor/pg_loss"][0] == pytest.approx(
        clipped_surrogate(own, old, advantages, mask, 0.8, 1.2), rel=1e-5)
    assert band_shifted["actor/pg_loss"][0] != pytest.approx(vanilla_shifted["actor/pg_loss"][0], rel=1e-3)
    assert math.isfinite(band_shifted["actor/pg_loss"][1])
