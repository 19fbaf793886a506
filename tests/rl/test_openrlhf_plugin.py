"""The OpenRLHF plug-in (bandcore.rl.openrlhf) against OpenRLHF's own PolicyLoss, the reference.

With a fixed clip (band_method="clip") the plug-in is OpenRLHF's loss bit for bit (loss, gradient, every returned
metric); with the Band it is OpenRLHF's loss with the per-token clip [l, u] of bandcore.band_log (bit for bit) and
band_policy_loss where the aggregation matches; the Band as the mismatch gate is OpenRLHF's binary-KL / TV gate for
kl / tv.  OpenRLHF 0.11.2 runs on the CPU here (tests/rl/openrlhf_host.py).
"""

from __future__ import annotations

import ast
import inspect
import math
from typing import ClassVar

import pytest
import torch
from openrlhf_host import actor_module_path, import_openrlhf_loss, import_plugin, train_module_path

openrlhf_loss = import_openrlhf_loss()
plugin = import_plugin()
from adapter_contract import CHECKS, Run  # noqa: E402

from bandcore import band_log  # noqa: E402
from bandcore.rl import band_policy_loss  # noqa: E402
from bandcore.rl import openrlhf_launch as launch  # noqa: E402
from bandcore.rl.settings import BandSettings  # noqa: E402

PolicyLoss, BandPolicyLoss = openrlhf_loss.PolicyLoss, plugin.BandPolicyLoss
B, T = 16, 48
NAMES = ("loss", "clip_ratio", "ppo_kl", "vllm_kl", "is_filter_ratio")


def _batch(dtype=torch.float64, seed: int = 3):
    """Old log-probabilities over (0.0025, 0.99), current ones moved by about ±1 (so that both bounds clip),
    per-token advantages of both signs, a mask with padding, and rollout log-probabilities near the old ones."""
    gen = torch.Generator().manual_seed(seed)
    old = -torch.empty(B, T, dtype=torch.float64).uniform_(0.01, 6.0, generator=gen)
    moved = old + 0.8 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    leaf = torch.where(moved > -1e-3, -1e-3 - (moved + 1e-3).abs(), moved)
    adv = torch.randn(B, T, generator=gen, dtype=torch.float64)
    mask = torch.arange(T)[None, :] < torch.randint(3, T + 1, (B,), generator=gen)[:, None]
    rollout = (old + 0.3 * torch.randn(B, T, generator=gen, dtype=torch.float64)).clamp(max=-1e-3)
    return [x.to(dtype) for x in (old, leaf, adv)] + [mask, rollout.to(dtype)]


class Batch:
    def __init__(self, dtype=torch.float64, seed: int = 3) -> None:
        self.old, leaf, self.adv, self.mask, self.rollout = _batch(dtype, seed)
        self.leaf = leaf.requires_grad_()

    def call(self, loss_fn, *, rollout: bool = False, **kwargs):
        """(outputs, gradient) of one call of ``loss_fn`` (a fresh graph)."""
        log_probs = self.leaf * 1.0
        out = loss_fn(log_probs, self.old, self.adv, action_mask=self.mask,
                      rollout_log_probs=self.rollout if rollout else None, **kwargs)
        (grad,) = torch.autograd.grad(out[0], self.leaf)
        return out, grad


def _assert_identical(got, want) -> None:
    (ours, our_grad), (theirs, their_grad) = got, want
    for name, a, b in zip(NAMES, ours, theirs, strict=True):
        if b is None:
            assert a is None, name
        else:
            assert a.dtype == b.dtype and torch.equal(a, b), f"{name}: {a} != {b}"
    assert torch.equal(our_grad, their_grad)


def _band_epsilons(batch: Batch, divergence, low: float, high: float, anchor=None, max_ratio=None, dtype=None):
    """bandcore.band_log's bounds as OpenRLHF's per-token clip_eps_low / clip_eps_high (fp64, then the dtype)."""
    at = torch.where(batch.mask, batch.old if anchor is None else anchor, 0.0).double()
    log_lower, log_upper = band_log(at, divergence, low)[0], band_log(at, divergence, high)[1]
    if max_ratio is not None:
        log_upper = log_upper.clamp(max=math.log(max_ratio))
    if anchor is not None:
        shift = torch.where(batch.mask, anchor.double() - batch.old.double(), 0.0)
        log_lower, log_upper = log_lower + shift, log_upper + shift
    dtype = dtype or batch.old.dtype
    return (torch.where(batch.mask, 1 - torch.exp(log_lower), 0.2).to(dtype),
            torch.where(batch.mask, torch.exp(log_upper) - 1, 0.2).to(dtype))


def _host_at(epsilons, **host_kwargs) -> PolicyLoss:
    host = PolicyLoss(**host_kwargs)
    host.clip_eps_low, host.clip_eps_high = epsilons
    return host


# ---------------------------------------------------------------------------------------------------------
# A fixed clip: OpenRLHF's own loss, bit for bit
# ---------------------------------------------------------------------------------------------------------

HOST_SETTINGS = [
    ({}, {}),
    ({"clip_eps_low": 0.2, "clip_eps_high": 0.28, "dual_clip": 3.0}, {}),
    ({"token_level_loss": False}, {}),
    ({}, {"dp_size": 2, "batch_num_tokens": 40.0}),
    ({"token_level_loss": False}, {"dp_size": 4, "global_batch_size": 16.0}),
    ({"is_correction_level": "token", "is_correction_threshold": [0.5, 2.0]}, {}),
    ({"is_correction_level": "token", "is_correction_mode": "clip", "is_correction_threshold": [0.8, 1.25]}, {}),
    ({"is_correction_level": "seq", "is_correction_gating": "binary_kl", "is_correction_threshold": [0.0, 0.01]}, {}),
    ({"is_correction_level": "token", "is_correction_gating": "tv", "is_correction_threshold": [0.0, 0.02]}, {}),
    ({"policy_loss_type": "gspo"}, {}),
]


@pytest.mark.parametrize("method", ["clip", "clip-higher"])
@pytest.mark.parametrize(("host_kwargs", "call_kwargs"), HOST_SETTINGS, ids=lambda x: str(x)[:60])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fixed_clip_is_openrlhf_bit_for_bit(method, host_kwargs, call_kwargs, dtype):
    batch = Batch(dtype)
    rollout = host_kwargs.get("is_correction_level", "off") != "off"
    ours = batch.call(BandPolicyLoss(**host_kwargs, band_method=method), rollout=rollout, **call_kwargs)
    theirs = batch.call(PolicyLoss(**host_kwargs), rollout=rollout, **call_kwargs)
    _assert_identical(ours, theirs)
    assert theirs[0][1] > 0  # OpenRLHF's clip acts on this batch


def test_fixed_clip_without_a_mask_is_openrlhf():
    batch = Batch()
    ours = BandPolicyLoss(band_method="clip")(batch.leaf, batch.old, batch.adv)
    theirs = PolicyLoss()(batch.leaf, batch.old, batch.adv)
    assert all(torch.equal(a, b) for a, b in zip(ours[:3], theirs[:3], strict=True))


# ---------------------------------------------------------------------------------------------------------
# The Band: OpenRLHF's clip at band_log's bounds, bit for bit, and band_policy_loss
# ---------------------------------------------------------------------------------------------------------

BAND_SETTINGS = [
    ("kl", 0.05, 0.05, None, {}),
    ("kl", 0.02, 0.1, None, {}),
    ("tv", 0.1, 0.1, 3.0, {"dual_clip": 3.0}),
    ("hellinger", 0.03, 0.08, None, {"token_level_loss": False}),
    ("alpha(0.5)", 0.05, 0.05, 10.0, {"clip_eps_low": 0.1, "clip_eps_high": 0.3}),
]


@pytest.mark.parametrize(("divergence", "low", "high", "max_ratio", "host_kwargs"), BAND_SETTINGS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_band_is_openrlhf_clip_at_the_band_bit_for_bit(divergence, low, high, max_ratio, host_kwargs, dtype):
    batch = Batch(dtype)
    ours = batch.call(BandPolicyLoss(**host_kwargs, band_divergence=divergence, band_delta_low=low,
                                     band_delta_high=high, band_max_ratio=max_ratio))
    epsilons = _band_epsilons(batch, divergence, low, high, max_ratio=max_ratio)
    theirs = batch.call(_host_at(epsilons, **host_kwargs))
    _assert_identical(ours, theirs)
    fixed = batch.call(PolicyLoss(**host_kwargs))
    assert ours[0][1] > 0 and ours[0][1] != fixed[0][1]  # the Band clips, and not as the fixed clip does


def test_rollout_anchor_is_openrlhf_clip_at_the_rollout_band():
    batch = Batch()
    kwargs = {"is_correction_level": "token", "is_correction_threshold": [0.5, 2.0]}
    ours = batch.call(BandPolicyLoss(**kwargs, band_delta=0.05, band_anchor="rollout"), rollout=True)
    epsilons = _band_epsilons(batch, "kl", 0.05, 0.05, anchor=batch.rollout)
    theirs = batch.call(_host_at(epsilons, **kwargs), rollout=True)
    _assert_identical(ours, theirs)
    old_anchor = batch.call(BandPolicyLoss(**kwargs, band_delta=0.05), rollout=True)
    assert not torch.equal(ours[0][0], old_anchor[0][0])


@pytest.mark.parametrize(("token_level", "mode"), [(True, "token-mean"), (False, "seq-mean-token-mean")])
@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_band_is_band_policy_loss(token_level, mode, dual_clip):
    """Where the aggregation matches: token-mean (exactly the same sums), seq-mean-token-mean (OpenRLHF adds 1e-8
    to each sequence's token count)."""
    batch = Batch()
    settings = {"divergence": "kl", "delta_low": 0.02, "delta_high": 0.1}
    ours, grad = batch.call(BandPolicyLoss(token_level_loss=token_level, dual_clip=dual_clip,
                                           **{f"band_{k}": v for k, v in settings.items()}))
    log_prob = batch.leaf * 1.0
    want, metrics = band_policy_loss(log_prob, batch.old, batch.adv, batch.mask, loss_agg_mode=mode,
                                     dual_clip=dual_clip, **settings)
    (want_grad,) = torch.autograd.grad(want, batch.leaf)
    rtol = 1e-13 if token_level else 1e-8
    torch.testing.assert_close(ours[0], want.detach(), rtol=rtol, atol=0)
    torch.testing.assert_close(grad, want_grad, rtol=rtol, atol=rtol * float(want_grad.abs().max()))
    assert ours[1].item() == pytest.approx(metrics["clipfrac"].item(), abs=1e-7)


@pytest.mark.parametrize("token_level", [True, False])
def test_dppo_form_is_band_policy_loss(token_level):
    batch = Batch()
    ours, grad = batch.call(BandPolicyLoss(token_level_loss=token_level, band_divergence="tv", band_delta=0.05,
                                           band_loss_form="dppo", band_clip_ratio_c=4.0))
    want, metrics = band_policy_loss(batch.leaf * 1.0, batch.old, batch.adv, batch.mask, divergence="tv", delta=0.05,
                                     loss_form="dppo", clip_ratio_c=4.0,
                                     loss_agg_mode="token-mean" if token_level else "seq-mean-token-mean")
    (want_grad,) = torch.autograd.grad(want, batch.leaf)
    rtol = 1e-13 if token_level else 1e-8
    torch.testing.assert_close(ours[0], want.detach(), rtol=rtol, atol=0)
    torch.testing.assert_close(grad, want_grad, rtol=rtol, atol=rtol * float(want_grad.abs().max()))
    assert ours[1] == metrics["clipfrac"] and 0 < ours[1] < 1  # the fraction of tokens dropped
    assert torch.equal(ours[2], PolicyLoss()(batch.leaf, batch.old, batch.adv, batch.mask)[2])  # OpenRLHF's ppo_kl
    assert ours[3] is None and ours[4] is None


# ---------------------------------------------------------------------------------------------------------
# The adapter contract (tests/rl/adapter_contract.py)
# ---------------------------------------------------------------------------------------------------------


class OpenRLHFDriver:
    keys: ClassVar[dict[str, str]] = {name: f"band_{name}" for name in BandSettings.__dataclass_fields__}
    metric_names = ("ppo_clip_ratio", "ppo_kl", "band/width_mean")
    delta_metrics = ("band/delta", "band/delta_low", "band/delta_high")
    shared_metrics = ("ppo_clip_ratio", "ppo_kl")
    rtol = 1e-13

    def __init__(self) -> None:
        self.data = Batch()

    def batch(self):
        return self.data.old, self.data.adv, self.data.mask

    def log_prob(self):
        return self.data.leaf * 1.0

    def _run(self, loss_fn) -> Run:
        out = loss_fn(self.log_prob(), self.data.old, self.data.adv, action_mask=self.data.mask)
        metrics = {"ppo_clip_ratio": out[1].item(), "ppo_kl": out[2].item()}
        metrics.update({k: float(v) for k, v in getattr(loss_fn, "band_metrics", {}).items()})
        return Run(out[0], [self.data.leaf], metrics)

    def plugin(self, **settings) -> Run:
        return self._run(BandPolicyLoss(**{f"band_{k}": v for k, v in settings.items()}))

    def host(self) -> Run:
        return self._run(PolicyLoss())

    def reference_kwargs(self, **settings):
        return {"loss_agg_mode": "token-mean"}

    def build(self, **settings) -> None:
        BandPolicyLoss(**{f"band_{k}": v for k, v in settings.items()})


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_the_openrlhf_plugin_keeps_the_adapter_contract(check):
    check(OpenRLHFDriver())


# ---------------------------------------------------------------------------------------------------------
# The Band as OpenRLHF's mismatch gate
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("gate", "gating"), [("kl", "binary_kl"), ("tv", "tv")])
def test_band_gate_of_kl_and_tv_is_openrlhfs_divergence_gate(gate, gating):
    """w = pi_old / pi_rollout in the Band of p_rollout iff g_f(p_rollout, w) <= δ: OpenRLHF's binary_kl / tv."""
    batch = Batch()
    delta = 0.01 if gate == "kl" else 0.05
    threshold = [0.0, delta]
    ours = batch.call(BandPolicyLoss(is_correction_level="token", is_correction_threshold=threshold,
                                     band_method="clip", band_gate=gate), rollout=True)
    theirs = batch.call(PolicyLoss(is_correction_level="token", is_correction_gating=gating,
                                   is_correction_threshold=threshold), rollout=True)
    _assert_identical(ours, theirs)
    assert 0 < theirs[0][4] < 1  # the gate drops some tokens and keeps others


@pytest.mark.parametrize("mode", ["mask", "clip"])
def test_band_gate_is_openrlhfs_ratio_gate_at_the_band(mode):
    batch = Batch()
    kwargs = {"is_correction_level": "token", "is_correction_mode": mode, "is_correction_threshold": [0.0, 0.02]}
    ours = batch.call(BandPolicyLoss(**kwargs, band_delta=0.05, band_gate="hellinger"), rollout=True)
    at = torch.where(batch.mask, batch.rollout, 0.0)
    lower, upper = (torch.exp(b) for b in band_log(at, "hellinger", 0.02))
    host = _host_at(_band_epsilons(batch, "kl", 0.05, 0.05), **kwargs)
    host.is_correction_threshold = (lower, upper)
    _assert_identical(ours, batch.call(host, rollout=True))
    assert ours[0][4] > 0


# ---------------------------------------------------------------------------------------------------------
# Settings refused, inputs checked, state restored
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"policy_loss_type": "gspo"}, r"policy_loss_type \(--actor.policy_loss_type\)='gspo'"),
        ({"band_loss_form": "dppo", "dual_clip": 3.0}, "dual_clip=3.0 applies to band_loss_form='clip'"),
        ({"band_loss_form": "dppo", "is_correction_level": "token"}, r"is_correction_level \(--algo"),
        ({"band_gate": "kl"}, "needs is_correction_level"),
        ({"band_gate": "kl", "is_correction_level": "token"}, "is_correction_threshold"),
        ({"band_gate": "kl", "is_correction_level": "token", "is_correction_gating": "tv",
          "is_correction_threshold": [0.0, 0.1]}, "is_correction_gating"),
        ({"band_gate": "nonsense(u", "is_correction_level": "token", "is_correction_threshold": [0.0, 0.1]},
         "band_gate"),
        ({"band_gate": "kl", "is_correction_level": "token", "is_correction_threshold": [0.0, -1.0]},
         "is_correction_threshold must be a finite number > 0"),
        ({"band_delta": 0.0}, "band_delta must be a finite number > 0"),
        ({"band_method": "clip", "clip_eps_low": 1.5}, "clip_eps_low must be in"),
    ],
)
def test_bad_settings_are_refused_naming_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BandPolicyLoss(**kwargs)


def test_unknown_band_keywords_are_refused():
    with pytest.raises(TypeError, match="band_dleta"):
        BandPolicyLoss(band_dleta=0.1)
    with pytest.raises(TypeError, match="band_dleta"):
        plugin.band_policy_loss_class(band_dleta=0.1)


def test_inputs_are_checked_with_openrlhfs_names():
    batch = Batch()
    with pytest.raises(ValueError, match="old_log_probs must be <= 0"):
        BandPolicyLoss()(batch.leaf, batch.old.abs() + 1, batch.adv, batch.mask)
    with pytest.raises(ValueError, match="rollout_log_probs must be <= 0"):
        BandPolicyLoss(band_anchor="rollout")(batch.leaf, batch.old, batch.adv, batch.mask, batch.rollout.abs() + 1)
    with pytest.raises(ValueError, match="band_anchor='rollout' needs rollout_log_probs"):
        BandPolicyLoss(band_anchor="rollout")(batch.leaf, batch.old, batch.adv, batch.mask)
    with pytest.raises(ValueError, match="action_mask must have the shape"):
        BandPolicyLoss()(batch.leaf, batch.old, batch.adv, batch.mask[:, :3])


def test_clip_and_gate_are_restored_after_each_call():
    batch = Batch()
    loss = BandPolicyLoss(is_correction_level="token", is_correction_threshold=[0.0, 0.02], band_gate="kl")
    batch.call(loss, rollout=True)
    assert (loss.clip_eps_low, loss.clip_eps_high, loss.is_correction_threshold) == (0.2, 0.2, [0.0, 0.02])
    with pytest.raises(TypeError):  # inside OpenRLHF's forward
        loss(batch.leaf, batch.old, batch.adv, batch.mask, batch.rollout, batch_num_tokens="forty")
    assert (loss.clip_eps_low, loss.clip_eps_high, loss.is_correction_threshold) == (0.2, 0.2, [0.0, 0.02])


def test_configured_class_supplies_its_settings_as_defaults():
    configured = plugin.band_policy_loss_class(band_divergence="tv", band_delta=0.1)
    assert issubclass(configured, BandPolicyLoss) and issubclass(configured, PolicyLoss)
    loss = configured(clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=3.0)
    assert (loss.band_settings.divergence, loss.band_settings.delta, loss.dual_clip) == ("tv", 0.1, 3.0)
    assert configured(band_delta=0.2).band_settings.delta == 0.2  # the constructor's keywords win
    with pytest.raises(ValueError, match="band_delta"):
        plugin.band_policy_loss_class(band_delta=-1.0)


def test_an_openrlhf_that_ignores_per_call_bounds_is_refused(monkeypatch):
    """The probe of OpenRLHF's forward: a PolicyLoss that fixes its clip when built would ignore the Band."""

    class FrozenClip(PolicyLoss):
        def forward(self, *args, **kwargs):
            self.clip_eps_low = self.clip_eps_high = 0.2
            self.is_correction_threshold = (0.5, 5.0)
            return super().forward(*args, **kwargs)

    monkeypatch.setattr(plugin, "PolicyLoss", FrozenClip)
    monkeypatch.setattr(plugin, "_probed", False)
    with pytest.raises(RuntimeError, match="no longer reads clip_eps_low"):
        BandPolicyLoss()


# ---------------------------------------------------------------------------------------------------------
# Radii that move: optimizer steps counted with torch's post-step hook
# ---------------------------------------------------------------------------------------------------------


def _train(loss_fn, steps: int, extra_optimizer: bool = False):
    """SGD steps of a linear softmax policy; the δ in use at each call."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(3, 5, dtype=torch.float64)
    critic = torch.nn.Linear(3, 1, dtype=torch.float64)
    x, tokens = torch.randn(B, T, 3, dtype=torch.float64), torch.randint(0, 5, (B, T))

    def log_probs():
        return torch.log_softmax(linear(x), -1).gather(-1, tokens[..., None])[..., 0]

    optimizer = torch.optim.SGD(linear.parameters(), lr=0.5)
    critic_optimizer = torch.optim.SGD(critic.parameters(), lr=0.1)
    with torch.no_grad():
        old = log_probs()
    adv = torch.randn(B, T, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    deltas = []
    for _ in range(steps):
        loss = loss_fn(log_probs(), old, adv, action_mask=torch.ones(B, T, dtype=torch.bool))[0]
        deltas.append(loss_fn.band_metrics["band/delta"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if extra_optimizer:  # a step of another optimizer, with no call of the loss since: not counted
            critic(x).sum().backward()
            critic_optimizer.step()
    return deltas


def test_a_schedule_moves_delta_once_per_optimizer_step():
    loss = BandPolicyLoss(band_delta=0.05, band_delta_schedule="linear", band_delta_end=0.01, band_delta_steps=2)
    assert _train(loss, 4, extra_optimizer=True) == [0.05, 0.03, 0.01, 0.01]
    assert loss.band_bounds.step == 4


def test_the_controller_moves_delta_with_the_measured_kl():
    """The first step's ratios are all exactly 1 (KL 0: no information, δ stays); from then on the policy moves far
    more than the target, and δ shrinks by the controller's largest factor e^-0.1 per step."""
    deltas = _train(BandPolicyLoss(band_delta=0.05, band_target_kl=1e-6), 4)
    assert deltas[:2] == [0.05, 0.05]
    assert deltas[2] == pytest.approx(0.05 * math.exp(-0.1), rel=5e-3) and deltas[3] < deltas[2]


# ---------------------------------------------------------------------------------------------------------
# Guards: what the launcher relies on in OpenRLHF's own modules
# ---------------------------------------------------------------------------------------------------------


def _keywords(call: ast.Call) -> dict[str, str]:
    return {kw.arg: ast.unparse(kw.value).replace("self.args.", "args.") for kw in call.keywords}


def test_actor_builds_policy_loss_with_the_arguments_the_launcher_checks():
    """OpenRLHF's actor calls the name PolicyLoss, imported from openrlhf.models, with exactly the arguments of
    launch.policy_loss_kwargs (so the driver checks the loss the workers will build)."""
    tree = ast.parse(actor_module_path().read_text())
    imports = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and node.module == "openrlhf.models" for alias in node.names}
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name) and node.func.id == "PolicyLoss"]
    assert "PolicyLoss" in imports and len(calls) == 1, "OpenRLHF's actor no longer builds PolicyLoss by that name"
    ours = ast.parse(inspect.getsource(launch.policy_loss_kwargs)).body[0].body[-1].value
    assert _keywords(calls[0]) == {ast.literal_eval(k): ast.unparse(v) for k, v in zip(ours.keys, ours.values,
                                                                                          strict=True)}
    assert list(inspect.signature(PolicyLoss.__init__).parameters)[1:] == list(_keywords(calls[0]))


def test_train_ppo_ray_calls_ray_init_then_get_strategy_with_its_parsed_args():
    """The launcher adds the worker hook in ray.init and checks the Band in get_strategy(args)."""
    tree = ast.parse(train_module_path().read_text())
    train = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "train")
    calls = [ast.unparse(node.func) for node in sorted((n for n in ast.walk(train) if isinstance(n, ast.Call)),
                                                       key=lambda n: (n.lineno, n.col_offset))]
    assert calls.index("ray.init") < calls.index("get_strategy")
    assert any(isinstance(node, ast.ImportFrom) and node.module == "openrlhf.utils"
               and "get_strategy" in {a.name for a in node.names} for node in tree.body)
