"""The verl plug-in: registry, config classes, both return conventions, registration routes, the launch script."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import verl.trainer.ppo.core_algos as core_algos  # README test command: --no-deps verl + bandcore[verl-registry]
from omegaconf import OmegaConf
from verl.workers.config import ActorConfig, PolicyLossConfig

from bandcore.rl import band_policy_loss
from bandcore.rl.loss import LOSS_AGG_MODES
from bandcore.rl.verl import BandPolicyLossConfig, _bandpo, compute_policy_loss_bandpo

ROOT = Path(__file__).resolve().parents[2]
B, T = 6, 7


def actor_config(policy_loss=None, **overrides) -> ActorConfig:
    kwargs = dict(strategy="fsdp", rollout_n=2, ppo_micro_batch_size_per_gpu=2,
                  policy_loss=policy_loss if policy_loss is not None else BandPolicyLossConfig())
    kwargs.update(overrides)
    return ActorConfig(**kwargs)


@pytest.fixture(scope="module")
def batch():
    gen = torch.Generator().manual_seed(3)
    old = torch.empty(B, T, dtype=torch.float64).uniform_(-5.0, -0.02, generator=gen)
    log_prob = old + 0.8 * torch.randn(B, T, dtype=torch.float64, generator=gen)
    advantages = torch.randn(B, 1, dtype=torch.float64, generator=gen).expand(B, T).contiguous()
    lengths = torch.tensor([7, 5, 3, 7, 1, 6])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    weights = torch.empty(B, T, dtype=torch.float64).uniform_(0.5, 1.5, generator=gen)
    return old, log_prob, advantages, mask, weights


def test_registry_returns_our_loss():
    assert core_algos.get_policy_loss_fn("bandpo") is compute_policy_loss_bandpo


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_matches_band_policy_loss(batch, mode):
    old, log_prob, adv, mask, _ = batch
    config = actor_config(BandPolicyLossConfig(band_delta=0.05, band_max_ratio=10.0), clip_ratio_c=10.0)
    x = log_prob.clone().requires_grad_()
    loss, metrics = core_algos.get_policy_loss_fn("bandpo")(old, x, adv, mask, loss_agg_mode=mode, config=config)
    y = log_prob.clone().requires_grad_()
    expected, ours = band_policy_loss(y, old, adv, mask, delta=0.05, max_ratio=10.0, dual_clip=10.0,
                                      loss_agg_mode=mode)
    # verl's agg_loss divides by (count + 1e-8) in seq-mean-token-mean: relative 1e-9 here
    torch.testing.assert_close(loss, expected, rtol=1e-8, atol=0)
    torch.testing.assert_close(torch.autograd.grad(loss, x)[0], torch.autograd.grad(expected, y)[0],
                               rtol=1e-8, atol=1e-300)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(float(ours["clipfrac"]), rel=1e-12)
    assert metrics["actor/ppo_kl"] == pytest.approx(float(ours["approx_kl"]), rel=1e-12)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(float(ours["dual_clipfrac"]), rel=1e-12)
    assert metrics["actor/band_width"] == pytest.approx(float(ours["band_width"]), rel=1e-12)
    assert all(isinstance(v, float) for v in metrics.values())
    assert 0 < metrics["actor/pg_clipfrac"] != metrics["actor/pg_clipfrac_fixed"]


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("method", ["clip", "clip-higher"])
def test_with_a_fixed_clip_it_is_verls_vanilla_loss(batch, mode, method):
    """band_method="clip": same numbers as verl's own vanilla loss, rollout weights and global batch info included."""
    old, log_prob, adv, mask, weights = batch
    n_tokens, n_seqs = int(mask.sum()), int((mask.sum(-1) > 0).sum())
    common = dict(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode=mode)
    band_cfg = actor_config(BandPolicyLossConfig(band_method=method), **common)
    vanilla_cfg = actor_config(PolicyLossConfig(loss_mode="vanilla"), **common)
    for cfg in (band_cfg, vanilla_cfg):  # as verl's ppo_loss fills it (here: 2 data-parallel ranks)
        cfg.global_batch_info.update(dp_size=2, batch_num_tokens=2 * n_tokens, global_batch_size=2 * n_seqs,
                                     loss_scale_factor=None)
    x = log_prob.clone().requires_grad_()
    ours, ours_m = compute_policy_loss_bandpo(old, x, adv, mask, mode, band_cfg, rollout_is_weights=weights)
    y = log_prob.clone().requires_grad_()
    theirs, theirs_m = core_algos.get_policy_loss_fn("vanilla")(old, y, adv, mask, mode, vanilla_cfg,
                                                                rollout_is_weights=weights)
    torch.testing.assert_close(ours, theirs, rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(torch.autograd.grad(ours, x)[0], torch.autograd.grad(theirs, y)[0],
                               rtol=1e-13, atol=1e-15)
    for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert ours_m[key] == pytest.approx(theirs_m[key], rel=1e-7, abs=1e-12), key  # verl: /(count + 1e-8)
    assert theirs_m["actor/pg_clipfrac"] > 0 and theirs_m["actor/pg_clipfrac_lower"] > 0


def test_rollout_is_weights_multiply_the_per_token_loss(batch):
    old, log_prob, adv, mask, weights = batch
    config = actor_config(loss_agg_mode="token-sum")
    plain, _ = compute_policy_loss_bandpo(old, log_prob, adv, mask, "token-sum", config)
    doubled, _ = compute_policy_loss_bandpo(old, log_prob, adv, mask, "token-sum", config,
                                            rollout_is_weights=torch.full_like(weights, 2.0))
    torch.testing.assert_close(doubled, 2 * plain, rtol=1e-15, atol=0)
    weighted, _ = compute_policy_loss_bandpo(old, log_prob, adv, mask, "token-sum", config, rollout_is_weights=weights)
    assert not torch.allclose(weighted, plain)


def test_legacy_four_tuple_convention(batch):
    """verl 0.5–0.6: (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower) as tensors, agg_loss without batch info."""
    old, log_prob, adv, mask, _ = batch
    config = actor_config(clip_ratio_c=2.0)
    config.global_batch_info.update(dp_size=1, batch_num_tokens=None, global_batch_size=None, loss_scale_factor=None)
    new_loss, new_metrics = _bandpo(old, log_prob, adv, mask, "seq-mean-token-mean", config, None,
                                    metrics_dict=True, batch_info=True)
    legacy = _bandpo(old, log_prob, adv, mask, "seq-mean-token-mean", config, None,
                     metrics_dict=False, batch_info=False)
    assert isinstance(legacy, tuple) and len(legacy) == 4 and all(isinstance(v, torch.Tensor) for v in legacy)
    torch.testing.assert_close(legacy[0], new_loss, rtol=1e-15, atol=0)
    assert float(legacy[1]) == pytest.approx(new_metrics["actor/pg_clipfrac"], rel=1e-12)
    assert float(legacy[2]) == pytest.approx(new_metrics["actor/ppo_kl"], rel=1e-12)
    assert float(legacy[3]) == pytest.approx(new_metrics["actor/pg_clipfrac_lower"], rel=1e-12)


def test_installed_verl_uses_the_dict_convention():
    import verl

    from bandcore.rl import verl as plugin

    assert verl.__version__ == "0.9.1"
    assert plugin.RETURNS_METRICS_DICT and plugin.AGG_LOSS_TAKES_BATCH_INFO


def test_omegaconf_actor_config_with_band_keys(batch):
    """Older verl hands the loss a DictConfig; band keys come from policy_loss, missing ones default."""
    old, log_prob, adv, mask, _ = batch
    config = OmegaConf.create({"clip_ratio_c": 3.0, "policy_loss": {"loss_mode": "bandpo", "band_delta": 0.1}})
    loss, _ = compute_policy_loss_bandpo(old, log_prob, adv, mask, "token-mean", config)
    expected, _ = band_policy_loss(log_prob, old, adv, mask, delta=0.1, dual_clip=3.0)
    torch.testing.assert_close(loss, expected, rtol=1e-13, atol=0)


def test_config_is_built_from_its_hydra_target():
    from verl.utils.config import omega_conf_to_dataclass

    node = OmegaConf.create({"_target_": "bandcore.rl.verl.BandPolicyLossConfig", "loss_mode": "bandpo",
                             "band_divergence": "tv", "band_delta": 0.1, "band_max_ratio": 10})
    config = omega_conf_to_dataclass(node)
    assert isinstance(config, BandPolicyLossConfig) and isinstance(config, PolicyLossConfig)
    assert (config.band_divergence, config.band_delta, config.band_max_ratio) == ("tv", 0.1, 10)
    assert BandPolicyLossConfig().loss_mode == "bandpo"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"band_delta": 0.0}, ValueError, "delta must be a finite number > 0, got 0.0"),
        ({"band_max_ratio": 0.5}, ValueError, "max_ratio must be a finite number > 1, got 0.5"),
        ({"band_method": "ppo"}, ValueError, "band_method must be one of .* got 'ppo'"),
        ({"band_divergence": "no-such-divergence"}, ValueError, "no-such-divergence"),
        ({"band_divergence": 3}, TypeError, "band_divergence must be a divergence name .* got 3"),
        ({"band_check": "yes"}, TypeError, "band_check must be True or False, got 'yes'"),
    ],
)
def test_bad_band_settings_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        BandPolicyLossConfig(**kwargs)


def test_inputs_are_checked_unless_band_check_is_off(batch):
    old, log_prob, adv, mask, _ = batch
    bad_old = old.clone()
    bad_old[0, 0] = 5.0  # a log-probability above 0 at a response token
    with pytest.raises(ValueError, match=r"old_log_prob must be <= 0 at unmasked tokens .* old_log_prob=5\.0"):
        compute_policy_loss_bandpo(bad_old, log_prob, adv, mask, "token-mean", actor_config())
    unchecked = actor_config(BandPolicyLossConfig(band_check=False))
    loss, _ = compute_policy_loss_bandpo(bad_old, log_prob, adv, mask, "token-mean", unchecked)
    assert torch.isnan(loss)  # never a silent clamp
    good, _ = compute_policy_loss_bandpo(old, log_prob, adv, mask, "token-mean", unchecked)
    checked, _ = compute_policy_loss_bandpo(old, log_prob, adv, mask, "token-mean", actor_config())
    assert torch.equal(good, checked)


def test_missing_config_is_refused(batch):
    old, log_prob, adv, mask, _ = batch
    with pytest.raises(ValueError, match="config must be verl's actor config"):
        compute_policy_loss_bandpo(old, log_prob, adv, mask)


# ---------------------------------------------------------------------------------------------------------
# Registration in a fresh process (what a Ray worker does)
# ---------------------------------------------------------------------------------------------------------

_CHECK = (
    "from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY as R; "
    "assert R['bandpo'].__module__ == 'bandcore.rl.verl', R; print('registered')"
)


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment,
                          timeout=300, check=False)


@pytest.mark.slow
def test_environment_variable_route_registers_the_loss():
    routed = _run("import verl; " + _CHECK, VERL_USE_EXTERNAL_PLUGINS="none",
                  VERL_USE_EXTERNAL_MODULES="bandcore.rl.verl")
    assert routed.returncode == 0 and "registered" in routed.stdout, routed.stderr


@pytest.mark.slow
def test_entry_point_registers_the_loss():
    """The pyproject entry point, loaded the way verl 0.9.1's __init__ loads the group ``verl.plugins``."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    section = re.search(r'^\[project\.entry-points\."verl\.plugins"\]\n(.*?)(?:^\[|\Z)', pyproject, re.S | re.M)
    entry_points = dict(re.findall(r'^(\w+) = "([\w.]+)"$', section.group(1), re.M))
    assert list(entry_points.values()) == ["bandcore.rl.verl"]
    import verl

    source = Path(verl.__file__).read_text()
    assert '_entry_points(group="verl.plugins")' in source and "_ep.load()" in source
    name, value = next(iter(entry_points.items()))
    code = (
        "import verl; from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY; "
        "assert 'bandpo' not in POLICY_LOSS_REGISTRY; "  # the control: nothing registers it by accident
        "from importlib.metadata import EntryPoint; "
        f"EntryPoint(name={name!r}, value={value!r}, group='verl.plugins').load(); " + _CHECK
    )
    loaded = _run(code, VERL_USE_EXTERNAL_PLUGINS="none")
    assert loaded.returncode == 0 and "registered" in loaded.stdout, loaded.stderr


@pytest.mark.slow
def test_the_plugin_imports_nothing_heavy():
    """Every Ray worker imports the plug-in: after verl's loss registry it adds bandcore's own modules only (no
    SymPy, CVXPY, Numba or Matplotlib: verl's registry may load SymPy itself, through ``torch._dynamo``)."""
    code = (
        "import sys, time; import verl.trainer.ppo.core_algos; before = set(sys.modules); "
        "start = time.perf_counter(); import bandcore.rl.verl; seconds = time.perf_counter() - start; "
        "print(sorted({m.split('.')[0] for m in set(sys.modules) - before})); print(seconds)"
    )
    done = _run(code, VERL_USE_EXTERNAL_PLUGINS="none")
    assert done.returncode == 0, done.stderr
    added, seconds = done.stdout.split("\n")[-3:-1]
    assert added == "['bandcore']", f"importing bandcore.rl.verl after verl's registry loaded {added}"
    assert float(seconds) < 10, seconds  # a generous bound (about 0.03 s measured on 2 CPU cores)


_REALISTIC = textwrap.dedent("""
    import sys
    import torch
    import verl  # loads the entry-point group "verl.plugins" (VERL_USE_EXTERNAL_PLUGINS=auto)
    from verl.trainer.ppo import core_algos
    registered_by_verl = "bandcore.rl.verl" in sys.modules
    loss_fn = core_algos.get_policy_loss_fn("bandpo")
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import ActorConfig
    node = {"_target_": "bandcore.rl.verl.BandPolicyLossConfig", "loss_mode": "bandpo", "band_divergence": "kl",
            "band_delta": 0.05, "band_max_ratio": 10}
    actor = ActorConfig(strategy="fsdp", rollout_n=8, ppo_micro_batch_size_per_gpu=8, clip_ratio_c=10.0,
                        policy_loss=omega_conf_to_dataclass(OmegaConf.create(node)))
    data = torch.load(sys.argv[1])
    # as verl's engine fills it for one data-parallel rank
    actor.global_batch_info.update(dp_size=1, batch_num_tokens=int(data["mask"].sum()), global_batch_size=8,
                                   loss_scale_factor=None)
    results = {"registered_by_verl": registered_by_verl, "name": f"{loss_fn.__module__}.{loss_fn.__name__}"}
    for mode in sys.argv[3:]:
        log_prob = data["log_prob"].clone().requires_grad_()
        loss, metrics = loss_fn(data["old"], log_prob, data["adv"], data["mask"], loss_agg_mode=mode, config=actor)
        loss.backward()
        results[mode] = {"loss": loss.detach(), "grad": log_prob.grad, "metrics": metrics}
    torch.save(results, sys.argv[2])
""")


@pytest.mark.slow
def test_verls_registry_resolves_bandpo_through_the_entry_point_on_realistic_shapes(tmp_path):
    """A fresh process: ``import verl`` loads the installed entry point, verl's registry resolves "bandpo", and
    the loss, called with verl's own ActorConfig on a batch of 8 responses x 256 tokens (fp32), equals
    band_policy_loss with the same settings: loss, gradient and clip metrics."""
    from importlib.metadata import entry_points

    declared = [ep.value for ep in entry_points(group="verl.plugins") if ep.name == "bandcore"]
    assert declared == ["bandcore.rl.verl"], f"installed entry points {declared}: reinstall with pip install -e ."
    gen = torch.Generator().manual_seed(11)
    b, t = 8, 256
    rare = torch.rand(b, t, generator=gen) < 0.2  # most tokens likely, a fifth of them rare
    old = torch.where(rare, -torch.empty(b, t).uniform_(1.0, 8.0, generator=gen),
                      -torch.empty(b, t).uniform_(0.0, 0.1, generator=gen))
    log_prob = torch.clamp(old + 0.3 * torch.randn(b, t, generator=gen), max=0.0)
    lengths = torch.randint(32, t + 1, (b,), generator=gen)
    data = {"old": old, "log_prob": log_prob, "mask": torch.arange(t)[None, :] < lengths[:, None],
            "adv": torch.randn(b, 1, generator=gen).expand(b, t).contiguous()}
    torch.save(data, tmp_path / "batch.pt")
    modes = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
    code = ["-c", _REALISTIC, str(tmp_path / "batch.pt"), str(tmp_path / "out.pt"), *modes]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VERL_USE_EXTERNAL_PLUGINS": "auto"}
    env.pop("VERL_USE_EXTERNAL_MODULES", None)
    done = subprocess.run([sys.executable, *code], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    results = torch.load(tmp_path / "out.pt")
    assert results["registered_by_verl"] and results["name"] == "bandcore.rl.verl.compute_policy_loss_bandpo"
    for mode in modes:
        x = log_prob.clone().requires_grad_()
        expected, ours = band_policy_loss(x, old, data["adv"], data["mask"], divergence="kl", delta=0.05,
                                          max_ratio=10.0, dual_clip=10.0, loss_agg_mode=mode)
        got = results[mode]
        torch.testing.assert_close(got["loss"], expected.detach(), rtol=1e-6, atol=0)
        torch.testing.assert_close(got["grad"], torch.autograd.grad(expected, x)[0], rtol=1e-5, atol=1e-9)
        assert got["metrics"]["actor/pg_clipfrac"] == pytest.approx(float(ours["clipfrac"]), rel=1e-6)
        assert got["metrics"]["actor/band_width"] == pytest.approx(float(ours["band_width"]), rel=1e-6)
        # the batch makes the check bite: the Band clips, and not like the fixed clip
        assert 0 < got["metrics"]["actor/pg_clipfrac"] != got["metrics"]["actor/pg_clipfrac_fixed"]


# ---------------------------------------------------------------------------------------------------------
# The launch script: every override is a real verl 0.9.1 key; the composed config builds our classes
# ---------------------------------------------------------------------------------------------------------


def _script_overrides() -> list[str]:
    text = (ROOT / "examples" / "verl_bandpo.sh").read_text()
    block = re.search(r"^OVERRIDES=\(\n(.*?)^\)", text, re.S | re.M).group(1)
    overrides = [line.strip() for line in block.splitlines() if line.strip()]
    values = {"NNODES": "2", "GPUS_PER_NODE": "8"}  # the other variables are paths

    def substitute(match: re.Match) -> str:
        return values.get(match.group(1), f"/placeholder/{match.group(1).lower()}")

    return [re.sub(r'"\$\{([A-Z_]+)(?::-[^}]*)?\}"', substitute, o).replace("'", "") for o in overrides]


def test_script_overrides_select_the_band():
    """The script runs verl's trainer on the recipe examples/recipes/verl_bandpo.yaml, which selects the Band."""
    text = (ROOT / "examples" / "verl_bandpo.sh").read_text()
    assert '--config-path="${RECIPES}" --config-name=verl_bandpo' in text
    recipe = OmegaConf.load(ROOT / "examples" / "recipes" / "verl_bandpo.yaml")
    policy_loss = recipe.actor_rollout_ref.actor.policy_loss
    assert policy_loss._target_ == "bandcore.rl.verl.BandPolicyLossConfig" and policy_loss.loss_mode == "bandpo"
    assert recipe.algorithm.rollout_correction.bypass_mode is False
    band_keys = {k for k in policy_loss if k.startswith("band_")}
    assert band_keys <= {f for f in BandPolicyLossConfig.__dataclass_fields__ if f.startswith("band_")}
    assert not any(".policy_loss." in o for o in _script_overrides())  # the Band's settings live in the recipe


@pytest.mark.slow
def test_script_overrides_compose_with_verls_own_config():
    """Hydra composes the recipe (verl's ppo_trainer.yaml and the Band's settings) with the script's overrides
    exactly as main_ppo does: an unknown key (without '+') is an error; the actor config then builds
    BandPolicyLossConfig and the loss runs on it."""
    import verl
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    overrides = _script_overrides()
    flat = OmegaConf.load(Path(config_dir) / "_generated_ppo_trainer.yaml")  # verl's config, flattened
    for override in overrides:
        key = override.split("=", 1)[0]
        if not key.startswith("+"):
            parent_key, _, leaf = key.rpartition(".")
            parent = OmegaConf.select(flat, parent_key)
            assert parent is not None and leaf in list(parent.keys()), key  # `in` skips '???' values
    with initialize_config_dir(config_dir=str(ROOT / "examples" / "recipes"), version_base=None):
        cfg = compose(config_name="verl_bandpo", overrides=overrides)
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        with pytest.raises(Exception, match="band_delta"):  # the '+' is needed: the key is not verl's
            compose(config_name="ppo_trainer", overrides=["actor_rollout_ref.actor.policy_loss.band_delta=0.1"])
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, BandPolicyLossConfig)
    assert (actor.policy_loss.band_delta, actor.policy_loss.band_max_ratio, actor.clip_ratio_c) == (0.05, 10, 10)
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES == "bandcore.rl.verl"
    old = torch.log(torch.tensor([[0.5, 0.08, 0.001]], dtype=torch.float64))
    _, metrics = core_algos.get_policy_loss_fn(actor.policy_loss.loss_mode)(
        old, old + 1.0, torch.ones(1, 3, dtype=torch.float64), torch.ones(1, 3, dtype=torch.bool),
        actor.loss_agg_mode, actor)
    assert metrics["actor/band_clipfrac_high"] == pytest.approx(2 / 3)  # r = e: above u at p = 0.5 and 0.08
