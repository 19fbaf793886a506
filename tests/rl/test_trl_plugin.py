"""The TRL plug-in: guards on the TRL internals it relies on, the loss it makes TRL compute, a real TRL run."""

from __future__ import annotations

import importlib.util
import inspect
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from packaging.version import Version
from trl import GRPOConfig, GRPOTrainer

from bandcore.rl import band_policy_loss
from bandcore.rl.trl import P_BUCKETS, BandGRPOConfig, BandGRPOTrainer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_grpo.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("trl_grpo_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# the example's task, tokenizer, model and reward functions (built locally; see examples/trl_grpo.py)
EX = _load_example()
TASK = EX.make_task("reverse")
PROMPTS = ["4721=", "1203=", "9981=", "5620="]


@pytest.fixture(scope="module")
def example():
    return EX


@pytest.mark.slow
def test_the_plugin_imports_nothing_heavy():
    """``bandcore.rl.trl`` adds none of SymPy, CVXPY, Numba, Matplotlib to what TRL's trainer loads itself."""
    heavy = ("sympy", "cvxpy", "numba", "matplotlib")
    code = (
        "import sys; from trl import GRPOConfig, GRPOTrainer; "
        f"before = [m for m in {heavy!r} if m in sys.modules]; "
        "import bandcore.rl.trl; "
        f"after = [m for m in {heavy!r} if m in sys.modules]; print(','.join(before)); print(','.join(after))"
    )
    env = {**os.environ, "PYTHONPATH": str(EXAMPLE.parents[1])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.split("\n")[-3:-1]
    assert after == before, f"bandcore.rl.trl loaded {after!r} (trl alone: {before!r})"
    assert not {"cvxpy", "numba", "matplotlib"} & set(after.split(","))


def _config(tmp_path, **overrides) -> BandGRPOConfig:
    kwargs = dict(
        output_dir=str(tmp_path), num_iterations=2, per_device_train_batch_size=4, num_generations=2,
        max_completion_length=5, beta=0.0, **EX.cpu_settings(),
    )
    kwargs.update(overrides)
    return BandGRPOConfig(**kwargs)


def _model():
    return EX.build_model(EX.build_tokenizer(TASK), seed=0)


def _trainer(example, tmp_path, trainer_class=BandGRPOTrainer, **overrides) -> BandGRPOTrainer:
    tokenizer = example.build_tokenizer(TASK)
    return trainer_class(
        model=example.build_model(tokenizer, seed=0),
        reward_funcs=example.digit_match,  # partial credit: advantages are rarely all 0
        args=_config(tmp_path, **overrides),
        train_dataset=example.build_dataset(TASK, 16, seed=0),
        processing_class=tokenizer,
    )


# ---------------------------------------------------------------------------------------------------------
# Guards: every private TRL name the plug-in relies on (these fail loudly when TRL changes)
# ---------------------------------------------------------------------------------------------------------


# The signatures of the private TRL methods the plug-in overrides or calls, as in the supported TRL versions
# (1.14 takes the logps arguments as *args; 1.15 and 1.16 name them).  The plug-in forwards *args / **kwargs,
# so it needs only ``model`` first and the tuple (logps, entropies, aux_loss) back.
_LOGPS_SIGNATURES = (
    ["self", "model", "args", "batch_size", "compute_aux_loss", "kwargs"],  # 1.14
    ["self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy",
     "compute_aux_loss", "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
     "num_tiles", "image_sizes", "image_position_ids", "token_type_ids", "mm_token_type_ids"],  # 1.15, 1.16
)


def _params(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_trl_private_methods_keep_their_signatures():
    """Every private GRPOTrainer method that bandcore.rl.trl overrides or calls, and the constructor it reads."""
    got = _params(GRPOTrainer._compute_loss)
    assert got == ["self", "model", "inputs"], (
        f"TRL changed GRPOTrainer._compute_loss{inspect.signature(GRPOTrainer._compute_loss)}: BandGRPOTrainer "
        "overrides it as _compute_loss(self, model, inputs); update bandcore/rl/trl.py for this TRL version"
    )
    got = _params(GRPOTrainer._get_per_token_logps_and_entropies)
    assert got[:2] == ["self", "model"] and (got in _LOGPS_SIGNATURES or got[:5] == _LOGPS_SIGNATURES[1][:5]), (
        "TRL changed GRPOTrainer._get_per_token_logps_and_entropies"
        f"{inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies)}: BandGRPOTrainer overrides it and "
        "reads the first element of its result as the current policy's per-token log-probabilities"
    )
    got = _params(GRPOTrainer.__init__)
    assert got[:4] == ["self", "model", "reward_funcs", "args"], (
        f"TRL changed GRPOTrainer.__init__{inspect.signature(GRPOTrainer.__init__)}: BandGRPOTrainer reads args "
        "as the third positional argument"
    )


def test_the_only_overrides_of_trl_methods_are_the_guarded_ones():
    """BandGRPOTrainer replaces exactly three GRPOTrainer methods, each guarded by the signature test above:
    a new override (or a TRL method that starts to share a name with ours) must be added to the guard."""
    trl_names = {name for klass in GRPOTrainer.__mro__ for name in vars(klass)}
    ours = {name for name in vars(BandGRPOTrainer) if not name.startswith("__") or name == "__init__"}
    assert ours & trl_names == {"__init__", "_compute_loss", "_get_per_token_logps_and_entropies"}
    # our own helpers keep to a band prefix, out of TRL's names
    assert all(name.startswith(("band_", "_band_", "_log_band_")) for name in ours - trl_names), ours - trl_names


def test_trl_version_range_is_checked(monkeypatch):
    import trl

    from bandcore.rl import trl as band_trl

    for version in ("1.14.0", "1.15.2", "1.16.0", "1.16.1.dev0"):
        band_trl._check_trl_version(version)
    for version in ("1.13.9", "1.17.0", "1.17.0.dev0", "2.0.0", "unknown"):
        with pytest.raises(ImportError, match=rf"supports trl>=1\.14,<1\.17 .* but trl {version} is installed"):
            band_trl._check_trl_version(version)
    # at import: a fresh copy of the module (the imported one stays as it is) under a TRL reporting 1.17.0
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    spec = importlib.util.spec_from_file_location("bandcore.rl._trl_version_probe", band_trl.__file__)
    with pytest.raises(ImportError, match=r"but trl 1\.17\.0 is installed"):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_the_rl_extra_pins_the_supported_trl_range():
    """pyproject's rl extra declares the range the import checks; CI tests its lower end (.ci/run)."""
    from bandcore.rl.trl import _TRL_RANGE, SUPPORTED_TRL

    root = EXAMPLE.parents[1]
    pyproject = (root / "pyproject.toml").read_text()
    assert f'"{SUPPORTED_TRL}"' in pyproject
    lowest = re.search(r'"trl==([\d.]+)" "transformers==([\d.]+)"', (root / ".ci" / "run").read_text())
    assert lowest, ".ci/run no longer installs the lowest supported TRL"
    assert Version(lowest[1]).release[:2] == _TRL_RANGE[0] and Version(lowest[1]).micro == 0, lowest[1]
    assert f'"transformers>={lowest[2]}"' in pyproject  # the lowest transformers the extra allows


def test_trl_clamps_and_measures_with_the_epsilon_attributes():
    """The Band route works only because TRL's loss and clip metrics read these attributes, broadcasting."""
    source = inspect.getsource(GRPOTrainer._compute_loss)
    for fragment in (
        'old_per_token_logps = inputs.get("old_per_token_logps")',
        "per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(",
        "log_ratio = per_token_logps - old_per_token_logps",
        "coef_2 = torch.clamp(coef_1, 1 - self.epsilon_low, 1 + self.epsilon_high)",
        "per_token_loss = -torch.min(per_token_loss1, per_token_loss2)",
        "is_low_clipped = (coef_1 < 1 - self.epsilon_low) & (advantages < 0)",
        "is_high_clipped = (coef_1 > 1 + self.epsilon_high) & (advantages > 0)",
        'elif self.loss_type in ["grpo", "bnpo", "dr_grpo", "dapo", "luspo"]:',
    ):
        assert fragment in source, f"TRL's _compute_loss changed: {fragment!r} not found"
    assert 'mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]' in source


def test_trl_computes_cispo_and_reads_the_batch_as_the_plugin_relies_on():
    """The lines of TRL's _compute_loss and _generate_and_score_completions whose meaning the plug-in relies on:
    the dppo form (cispo's truncation read from epsilon_high), TRL's on-policy rule, the anchor's key."""
    loss_source = inspect.getsource(GRPOTrainer._compute_loss)
    for fragment in (
        'old_per_token_logps = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps',
        "clamped_ratios = torch.clamp(coef_1, max=self.epsilon_high).detach()",
        "per_token_loss = -clamped_ratios * advantages * per_token_logps",
        'elif self.loss_type in ["cispo", "dapo", "vespo"]:',
        'per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]',
    ):
        assert fragment in loss_source, f"TRL's _compute_loss changed: {fragment!r} not found"
    before = loss_source.index("self._get_per_token_logps_and_entropies(")
    assert loss_source.count("self._get_per_token_logps_and_entropies(") == 1, (
        "TRL's _compute_loss calls _get_per_token_logps_and_entropies more than once: the plug-in sets its bounds "
        "at that call")
    assert before < loss_source.index("coef_1 = torch.exp(log_importance_weights)"), (
        "TRL's _compute_loss computes the ratio before the current log-probabilities: the plug-in sets the "
        "per-token epsilons at the _get_per_token_logps_and_entropies call and needs them before the ratio is used")
    generation = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    for fragment in (
        "generate_every = self.args.steps_per_generation * self.num_iterations",
        "if self.args.gradient_accumulation_steps % generate_every != 0 or (",
        'output["sampling_per_token_logps"] = sampling_per_token_logps',
        'output["old_per_token_logps"] = old_per_token_logps',
    ):
        assert fragment in generation, (
            f"TRL's _generate_and_score_completions changed: {fragment!r} not found (bandcore.rl.trl's on-policy "
            "rule and its rollout anchor read what it produces)")


def test_every_trl_loss_type_is_supported_or_refused_with_a_reason():
    """A loss type TRL adds fails here until it is listed in SUPPORTED_SETTINGS or REFUSED_SETTINGS."""
    from bandcore.rl.trl import LOSS_FORM_OF, REFUSED_SETTINGS, SUPPORTED_SETTINGS

    source = inspect.getsource(GRPOTrainer._compute_loss)
    trl_types = set(re.findall(r'"(\w+)"', " ".join(re.findall(r"self\.loss_type (?:==|in) ([^:]+):", source))))
    help_text = GRPOConfig.__dataclass_fields__["loss_type"].metadata["help"]
    documented = set(re.findall(r"'(\w+)'", help_text.split("Supported values are", 1)[1].split(".")[0]))
    assert trl_types == documented, (trl_types, documented)
    ours = {value for key, value in {**SUPPORTED_SETTINGS, **REFUSED_SETTINGS} if key == "loss_type"}
    assert trl_types == ours, (
        f"TRL's loss types {sorted(trl_types)} differ from those bandcore.rl.trl lists {sorted(ours)}: add each new "
        "one to SUPPORTED_SETTINGS (with LOSS_FORM_OF) or to REFUSED_SETTINGS with the reason")
    assert {v for k, v in SUPPORTED_SETTINGS if k == "loss_type"} == set(LOSS_FORM_OF)
    levels = inspect.getsource(GRPOTrainer._compute_loss)
    assert set(re.findall(r'self\.importance_sampling_level == "(\w+)"', levels)) == {
        value for key, value in {**SUPPORTED_SETTINGS, **REFUSED_SETTINGS} if key == "importance_sampling_level"}


def _refused_rows():
    from bandcore.rl.trl import REFUSED_SETTINGS

    return sorted(REFUSED_SETTINGS.items(), key=str)


@pytest.mark.parametrize(("setting", "reason"), _refused_rows(), ids=lambda x: str(x))
def test_each_refused_setting_says_why(tmp_path, setting, reason):
    key, value = setting
    overrides = {key: value}
    if key == "loss_type" and value == "luspo":
        overrides["importance_sampling_level"] = "token"
    with pytest.raises(ValueError, match=re.escape(f"{key} must be one of")) as caught:
        _config(tmp_path, **overrides)
    assert f"got {value!r} ({reason})" in str(caught.value)


def test_supported_settings_are_listed_in_the_docs():
    """docs/rl.md has one table row per supported and per refused TRL setting, with the same verdict."""
    from bandcore.rl.trl import REFUSED_SETTINGS, SUPPORTED_SETTINGS

    docs = (EXAMPLE.parents[1] / "docs" / "rl.md").read_text()
    for rows, verdict in ((SUPPORTED_SETTINGS, "supported"), (REFUSED_SETTINGS, "refused")):
        for (key, value), reason in rows.items():
            row = f"| `{key}` | `{value!r}` | {verdict}: {reason} |"
            assert row in docs, f"docs/rl.md lacks the row {row}"


def test_trainer_attributes_exist_after_init(example, tmp_path):
    trainer = _trainer(example, tmp_path, epsilon=0.2, epsilon_high=0.28)
    assert trainer.epsilon_low == 0.2 and trainer.epsilon_high == 0.28
    assert trainer.importance_sampling_level == "token" and trainer.loss_type == "dapo"
    assert set(trainer._metrics) == {"train", "eval"}
    assert trainer._metrics["train"]["never-logged"] == []  # a defaultdict(list): the plug-in appends to new keys
    assert hasattr(trainer, "accelerator") and hasattr(trainer.accelerator, "reduce")
    assert isinstance(trainer.accelerator.sync_gradients, bool)  # the controller's end-of-step signal
    assert trainer.state.global_step == 0  # the schedule's step


# ---------------------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"importance_sampling_level": "sequence", "loss_type": "grpo"}, "importance_sampling_level .* 'sequence'"),
        ({"loss_type": "cispo"}, "band_loss_form='clip' runs through TRL's loss_type in .* got loss_type='cispo'"),
        ({"band_loss_form": "dppo"}, "band_loss_form='dppo' runs through TRL's loss_type in \\('cispo',\\), got "
                                     "loss_type='dapo'"),
        ({"loss_type": "sapo"}, "loss_type must be one of .* got 'sapo'"),
        ({"loss_type": "vespo"}, "loss_type must be one of .* got 'vespo'"),
        ({"loss_type": "luspo", "importance_sampling_level": "sequence"}, "importance_sampling_level"),
        ({"use_liger_kernel": True}, r"use_liger_kernel must be one of \(False,\) .* got True \(Liger's fused"),
        ({"band_delta": 0.0}, "delta must be a finite number > 0, got 0.0"),
        ({"band_max_ratio": 1.0}, "max_ratio must be a finite number > 1, got 1.0"),
        ({"band_divergence": "no-such-divergence"}, "no-such-divergence"),
    ],
)
def test_unsupported_settings_are_refused(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        _config(tmp_path, **overrides)


def test_the_default_configuration_is_off_policy(tmp_path):
    config = BandGRPOConfig(output_dir=str(tmp_path), **EX.cpu_settings())
    assert config.num_iterations == 2 and not config.band_allow_on_policy
    assert config.gradient_accumulation_steps % (config.steps_per_generation * config.num_iterations) != 0


@pytest.mark.parametrize(
    "overrides",
    [
        {"num_iterations": 1},
        {"num_iterations": 1, "gradient_accumulation_steps": 4, "steps_per_generation": 2},
        # TRL's rule is a divisibility: two passes that both fall inside one optimizer step never move the ratio
        {"num_iterations": 2, "gradient_accumulation_steps": 2, "steps_per_generation": 1},
    ],
)
def test_a_ratio_that_is_always_one_is_refused_unless_allowed(tmp_path, overrides):
    with pytest.raises(ValueError, match=r"ratio is always 1 with num_iterations=\d+, steps_per_generation=\d+, "
                                         r"gradient_accumulation_steps=\d+ .* band_allow_on_policy=True"):
        _config(tmp_path, **overrides)
    assert _config(tmp_path, band_allow_on_policy=True, **overrides).band_allow_on_policy


@pytest.mark.parametrize(
    "overrides",
    [{"num_iterations": 1, "gradient_accumulation_steps": 3, "steps_per_generation": 2},
     {"num_iterations": 2, "gradient_accumulation_steps": 2}, {"num_iterations": 3}],
)
def test_off_policy_configurations_are_accepted(tmp_path, overrides):
    _config(tmp_path, **overrides)


def test_an_on_policy_change_after_the_config_is_refused_by_the_trainer(example, tmp_path):
    config = _config(tmp_path)
    config.num_iterations = 1
    with pytest.raises(ValueError, match="ratio is always 1"):
        BandGRPOTrainer(model=_model(), args=config, reward_funcs=example.exact_match)


def test_allowed_on_policy_training_runs_trl_unchanged_without_a_warning(example, tmp_path):
    trainer = _trainer(example, tmp_path, loss_type="bnpo", num_iterations=1, band_allow_on_policy=True)
    trainer.model.eval()
    inputs, _ = _inputs(trainer)
    del inputs["old_per_token_logps"]
    trainer._compute_loss(trainer.model, inputs)  # filterwarnings = error: a warning would raise
    assert trainer._metrics["eval"]["clip_ratio/region_mean"][-1] == 0
    assert "band/width_mean" not in trainer._metrics["eval"]


def test_settings_changed_after_the_config_are_refused_by_the_trainer(example, tmp_path):
    config = _config(tmp_path)
    config.loss_type = "sapo"
    with pytest.raises(ValueError, match=r"loss_type must be one of .* got 'sapo'"):
        BandGRPOTrainer(model=_model(), args=config, reward_funcs=example.exact_match)


def test_a_plain_grpo_config_is_refused(example, tmp_path):
    config = GRPOConfig(output_dir=str(tmp_path), **EX.cpu_settings())
    with pytest.raises(TypeError, match="args must be a BandGRPOConfig, got GRPOConfig"):
        BandGRPOTrainer(model=_model(), args=config, reward_funcs=example.exact_match)


# ---------------------------------------------------------------------------------------------------------
# The loss TRL computes under the Band equals band_policy_loss
# ---------------------------------------------------------------------------------------------------------


def _inputs(trainer, seed=1):
    """A hand-built micro-batch as TRL's _generate_and_score_completions would hand it to _compute_loss."""
    tok = trainer.processing_class
    gen = torch.Generator().manual_seed(seed)
    prompt_ids = torch.tensor(tok(PROMPTS)["input_ids"])
    completion_ids = torch.randint(len(EX.SPECIAL_TOKENS), len(tok), (4, 5), generator=gen)  # characters only
    completion_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]])
    model = trainer.model
    with torch.no_grad():
        ids = torch.cat([prompt_ids, completion_ids], 1)
        attention = torch.cat([torch.ones_like(prompt_ids), completion_mask], 1)
        start = prompt_ids.shape[1] - 1  # the logits that predict the completion tokens
        logits = model(input_ids=ids, attention_mask=attention).logits[:, start:-1] / trainer.args.temperature
        log_prob = torch.log_softmax(logits.float(), -1).gather(-1, completion_ids[..., None])[..., 0]
    # the old policy differs from the current one by a shift large enough to cross every bound
    old = log_prob + 1.2 * torch.randn(log_prob.shape, generator=gen)
    old = torch.clamp(old, max=-1e-3)
    inputs = {
        "prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids, "completion_mask": completion_mask,
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]), "old_per_token_logps": old,
        "num_items_in_batch": completion_mask.sum(),
    }
    return inputs, log_prob


@pytest.mark.parametrize(
    ("loss_type", "agg"),
    [("bnpo", "token-mean"), ("dapo", "token-mean"), ("grpo", "seq-mean-token-mean"),
     ("dr_grpo", "seq-mean-token-sum-norm")],
)
def test_trl_computes_the_band_loss_and_metrics(example, tmp_path, loss_type, agg):
    trainer = _trainer(example, tmp_path, loss_type=loss_type, band_delta=0.05, epsilon=0.2)
    trainer.model.eval()  # eval: no gradient-accumulation normaliser; the tiny Llama has no dropout
    inputs, log_prob = _inputs(trainer)
    loss = trainer._compute_loss(trainer.model, inputs)
    expected, metrics = band_policy_loss(
        log_prob, inputs["old_per_token_logps"], inputs["advantages"], inputs["completion_mask"],
        divergence="kl", delta=0.05, loss_agg_mode=agg, norm_length=5,
    )
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-5)
    logged = {k: v[-1] for k, v in trainer._metrics["eval"].items()}
    assert logged["clip_ratio/region_mean"] == pytest.approx(float(metrics["clipfrac"]), abs=1e-6)
    assert logged["clip_ratio/high_mean"] == pytest.approx(float(metrics["clipfrac_high"]), abs=1e-6)
    assert logged["clip_ratio/low_mean"] == pytest.approx(float(metrics["clipfrac_low"]), abs=1e-6)
    assert logged["band/clip_ratio_fixed/region_mean"] == pytest.approx(float(metrics["clipfrac_fixed"]), abs=1e-6)
    assert logged["band/width_mean"] == pytest.approx(float(metrics["band_width"]), rel=1e-5)
    assert logged["band/clip_ratio/low"] == pytest.approx(logged["clip_ratio/low_mean"], abs=1e-6)
    assert logged["band/clip_ratio/high"] == pytest.approx(logged["clip_ratio/high_mean"], abs=1e-6)
    assert logged["band/clip_ratio/region"] == pytest.approx(logged["clip_ratio/region_mean"], abs=1e-6)
    # the batch makes the comparison meaningful: the Band and the fixed clip both act, and differently
    assert float(metrics["clipfrac_high"]) > 0 and float(metrics["clipfrac_low"]) > 0
    assert float(metrics["clipfrac"]) != float(metrics["clipfrac_fixed"])
    # the scalar epsilons are back after the call
    assert trainer.epsilon_low == 0.2 and trainer.epsilon_high == 0.2


def test_gradient_matches_band_policy_loss(example, tmp_path):
    trainer = _trainer(example, tmp_path, loss_type="bnpo", band_delta=0.05, band_max_ratio=1.5)
    trainer.model.eval()
    inputs, _ = _inputs(trainer, seed=7)
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(trainer._compute_loss(trainer.model, inputs), params)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    logits = trainer.model(input_ids=ids, attention_mask=attention).logits[:, inputs["prompt_ids"].shape[1] - 1 : -1]
    log_prob = torch.log_softmax(logits.float(), -1).gather(-1, inputs["completion_ids"][..., None])[..., 0]
    loss, _ = band_policy_loss(log_prob, inputs["old_per_token_logps"], inputs["advantages"],
                               inputs["completion_mask"], delta=0.05, max_ratio=1.5)
    expected = torch.autograd.grad(loss, params)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)


def test_clip_fractions_per_old_probability_bucket(example, tmp_path):
    trainer = _trainer(example, tmp_path, loss_type="bnpo", band_delta=0.05)
    trainer.model.eval()
    inputs, log_prob = _inputs(trainer, seed=3)
    # spread the old probabilities over every bucket
    old = torch.log(torch.tensor([[0.002, 0.05, 0.3, 0.7, 0.9], [0.005, 0.02, 0.2, 0.6, 0.1],
                                  [0.5, 0.09, 0.01, 0.001, 0.4], [0.03, 0.8, 0.3, 0.004, 0.6]]))
    inputs["old_per_token_logps"] = old
    trainer._compute_loss(trainer.model, inputs)
    logged = {k: v[-1] for k, v in trainer._metrics["eval"].items()}
    lower, upper = trainer.band_ratio_bounds(old)
    ratio = torch.exp(log_prob - old)
    adv = inputs["advantages"][:, None]
    clipped = ((ratio < lower) & (adv < 0)) | ((ratio > upper) & (adv > 0))
    mask = inputs["completion_mask"].bool()
    p = old.exp()
    seen = 0
    for name, lo, hi in P_BUCKETS:
        in_bucket = mask & (p >= lo) & (p < hi)
        assert in_bucket.any(), name
        expected = (clipped & in_bucket).sum().item() / in_bucket.sum().item()
        assert logged[f"band/clip_ratio/{name}"] == pytest.approx(expected, abs=1e-6), name
        seen += expected > 0
    assert seen >= 2  # the batch clips in more than one bucket
    assert logged["band/clip_ratio/region"] == pytest.approx((clipped & mask).sum().item() / mask.sum().item())


def test_an_empty_bucket_logs_nothing(example, tmp_path):
    trainer = _trainer(example, tmp_path, loss_type="bnpo")
    trainer.model.eval()
    inputs, _ = _inputs(trainer)
    inputs["old_per_token_logps"] = torch.full((4, 5), math.log(0.3))
    trainer._compute_loss(trainer.model, inputs)
    keys = {k for k in trainer._metrics["eval"] if k.startswith("band/clip_ratio/p")}
    assert keys == {"band/clip_ratio/p0.1-0.5"}


def test_on_policy_batches_warn_once_and_leave_trl_unchanged(example, tmp_path):
    trainer = _trainer(example, tmp_path, loss_type="bnpo")
    trainer.model.eval()
    inputs, _ = _inputs(trainer)
    del inputs["old_per_token_logps"]
    with pytest.warns(UserWarning, match="no old_per_token_logps .* the Band never clips"):
        loss = trainer._compute_loss(trainer.model, inputs)
    # ratio = 1: the loss is -mean(A) over tokens, nothing clips
    mask = inputs["completion_mask"].float()
    expected = -(inputs["advantages"][:, None] * mask).sum() / mask.sum()
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-6)
    assert trainer._metrics["eval"]["clip_ratio/region_mean"][-1] == 0
    trainer._compute_loss(trainer.model, inputs)  # no second warning (filterwarnings = error would raise)


def test_the_bounds_are_set_at_the_one_logps_call_of_each_loss(example, tmp_path):
    """Behaviour behind the source guards: _compute_loss calls _get_per_token_logps_and_entropies once, and its
    first result is the current policy's (B, T) log-probabilities that TRL's ratio uses."""

    class Counting(BandGRPOTrainer):
        calls: list = []  # noqa: RUF012

        def _get_per_token_logps_and_entropies(self, *pargs, **kwargs):
            out = super()._get_per_token_logps_and_entropies(*pargs, **kwargs)
            self.calls.append(out[0].detach())
            return out

    trainer = _trainer(example, tmp_path, trainer_class=Counting, loss_type="bnpo")
    trainer.model.eval()
    inputs, log_prob = _inputs(trainer)
    trainer._compute_loss(trainer.model, inputs)
    assert len(Counting.calls) == 1
    real = inputs["completion_mask"].bool()  # (the padding's log-probabilities depend on TRL's attention mask)
    torch.testing.assert_close(Counting.calls[0][real], log_prob[real], rtol=1e-5, atol=1e-6)
