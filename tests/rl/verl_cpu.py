"""verl's real actor update on the CPU, for tests/rl/test_verl_actor_update.py (run as a subprocess).

``python tests/rl/verl_cpu.py < spec.json`` prints one JSON line: for each run of the spec, the metrics of
``TrainingWorker.train_mini_batch`` (verl 0.9.1's actor update: ``FSDPEngineWithLMHead.train_batch`` ->
``losses.ppo_loss`` -> the registered policy loss) on one batch, with FSDP2 over a gloo process group of size 1,
and the old log-probabilities it trained against (verl's own ``infer_batch`` of the same model, optionally
shifted per response position).

verl 0.9.1 has no CPU platform, so three shims live here and only here (never in the library):

* a CPU platform registered through verl's own ``PlatformRegistry`` and made current with ``set_platform``,
  before any ``verl.workers`` module caches the device name;
* ``VERL_ENGINE_DEVICE=cuda``: the engine registry lists engines for cuda/npu only; the FSDP engine itself
  runs on whatever ``get_device_name()`` says;
* ``monkey_patch.is_trl_available`` off: verl imports TRL's value-head model class when TRL is installed, and
  TRL 1.16 no longer has it (value heads are not used here).

Spec: ``{"model_dir": str, "runs": [{"name": str, "loss_mode": str, "policy_loss": {...}, "actor": {...},
"shift": {"position": amount}}]}``; ``policy_loss`` holds the loss config's fields (for ``bandpo``, those of
:class:`bandcore.rl.verl.BandPolicyLossConfig`), ``actor`` extra ``FSDPActorConfig`` fields, ``shift`` lowers the
old log-probability at a response position by ``amount`` (its ratio becomes e^amount).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import types

import torch

BATCH, PROMPT, RESPONSE = 4, 5, 6
PROMPT_LENGTHS, RESPONSE_LENGTHS = (5, 3, 4, 2), (6, 4, 5, 3)
ADVANTAGES = (1.0, -1.0, 0.5, -0.5)
EPOCHS, MICRO_BATCH, LEARNING_RATE = 2, 2, 3e-2
FP32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}


def save_tiny_llama(model_dir: str) -> None:
    """A 2-layer Llama built from a config (no download), saved once."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    if os.path.exists(os.path.join(model_dir, "config.json")):
        return
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(model_dir)


def _zero(*_args, **_kwargs) -> int:
    return 0


def _nothing(*_args, **_kwargs) -> None:
    return None


def install_cpu_platform() -> None:
    """The three shims of the module docstring; before any verl.workers import."""
    os.environ["VERL_ENGINE_DEVICE"] = "cuda"
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry, set_platform

    # what verl calls on torch.<device>: memory statistics (all 0 here), seeds and RNG state, device queries
    device = types.SimpleNamespace(
        is_available=lambda: True, device_count=lambda: 1, current_device=_zero, set_device=_nothing,
        synchronize=_nothing, empty_cache=_nothing, max_memory_allocated=_zero, max_memory_reserved=_zero,
        memory_allocated=_zero, memory_reserved=_zero, reset_peak_memory_stats=_nothing,
        mem_get_info=lambda *_a, **_k: (0, 0), get_device_name=lambda *_a, **_k: "CPU",
        manual_seed=torch.manual_seed, manual_seed_all=torch.manual_seed, get_rng_state=torch.get_rng_state,
        set_rng_state=torch.set_rng_state, memory=types.SimpleNamespace(_set_allocator_settings=_nothing),
    )  # fmt: skip

    @PlatformRegistry.register(platform="cpu")
    class CPUPlatform(PlatformBase):
        device_name = property(lambda self: "cpu")
        vendor_name = property(lambda self: "cpu")
        device_module = property(lambda self: device)

        def is_available(self):
            return True

        def is_platform_available(self, use_smi_check=False):
            return True

        def current_device(self):
            return torch.device("cpu")  # passed to .to(...) and as FSDP's device

        def device_count(self):
            return 1

        def set_device(self, device_index):
            return None

        def synchronize(self, device_index=None):
            return None

        def manual_seed(self, seed):
            torch.manual_seed(seed)

        def manual_seed_all(self, seed):
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings):
            return None

        def empty_cache(self):
            return None

        def get_device_capability(self, device_index=0):
            return None, None

        def communication_backend_name(self):
            return "gloo"

        def visible_devices_envvar(self):
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg):
            yield

        def profiler_start(self):
            return None

        def profiler_stop(self):
            return None

        def ray_resource_name(self):
            return "CPU"

        def ray_noset_envvars(self):
            return []

        def is_ipc_supported(self):
            return False

        def cudart(self):
            return None

    set_platform(CPUPlatform())
    import verl.models.transformers.monkey_patch as monkey_patch

    monkey_patch.is_trl_available = lambda: False


def init_process_group() -> None:
    import torch.distributed as dist

    for key, value in {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(key, value)
    if not dist.is_initialized():
        with contextlib.closing(__import__("socket").socket()) as probe:  # a free port
            probe.bind(("127.0.0.1", 0))
            os.environ.setdefault("MASTER_PORT", str(probe.getsockname()[1]))
        dist.init_process_group(backend="gloo", rank=0, world_size=1)


def batch_tensors() -> dict[str, torch.Tensor]:
    """Left-padded prompts and right-padded responses of random tokens, advantages of both signs."""
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(3, 64, (BATCH, PROMPT), generator=g)
    responses = torch.randint(3, 64, (BATCH, RESPONSE), generator=g)
    prompt_mask = (torch.arange(PROMPT)[None] >= (PROMPT - torch.tensor(PROMPT_LENGTHS))[:, None]).long()
    response_mask = (torch.arange(RESPONSE)[None] < torch.tensor(RESPONSE_LENGTHS)[:, None]).long()
    attention = torch.cat([prompt_mask, response_mask], 1)
    return {
        "input_ids": torch.cat([prompts * prompt_mask, responses * response_mask], 1),
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "advantages": torch.tensor(ADVANTAGES)[:, None].expand(BATCH, RESPONSE) * response_mask,
        "old_log_probs": torch.zeros(BATCH, RESPONSE),  # replaced by infer_batch's
    }


def make_worker(model_dir: str, run: dict):
    """verl's TrainingWorker with verl's ppo_loss bound to the actor config of ``run``."""
    from functools import partial

    from verl.workers.config import FSDPActorConfig, HFModelConfig, PolicyLossConfig, TrainingWorkerConfig
    from verl.workers.config.engine import FSDPEngineConfig
    from verl.workers.config.optimizer import FSDPOptimizerConfig
    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils.losses import ppo_loss

    if run["loss_mode"] == "bandpo":
        from bandcore.rl.verl import BandPolicyLossConfig

        policy_loss = BandPolicyLossConfig(**run.get("policy_loss", {}))
    else:
        policy_loss = PolicyLossConfig(loss_mode=run["loss_mode"], **run.get("policy_loss", {}))
    model = HFModelConfig(path=model_dir, load_tokenizer=False, use_remove_padding=False,
                          override_config={"attn_implementation": "sdpa"})  # fmt: skip
    actor = FSDPActorConfig(strategy="fsdp2", rollout_n=1, ppo_mini_batch_size=BATCH,
                            ppo_micro_batch_size_per_gpu=MICRO_BATCH, ppo_epochs=EPOCHS, policy_loss=policy_loss,
                            use_torch_compile=False, optim=FSDPOptimizerConfig(lr=LEARNING_RATE),
                            fsdp_config=FSDPEngineConfig(use_torch_compile=False, mixed_precision=FP32),
                            **run.get("actor", {}))  # fmt: skip
    actor.model_config = model
    config = TrainingWorkerConfig(model_type="language_model", model_config=model, engine_config=actor.engine,
                                  optimizer_config=actor.optim, checkpoint_config=actor.checkpoint)  # fmt: skip
    config.engine_config.micro_batch_size_per_gpu = MICRO_BATCH
    config.engine_config.infer_micro_batch_size_per_gpu = MICRO_BATCH
    config.engine_config.use_dynamic_bsz = False
    worker = TrainingWorker(config=config)
    worker.reset()
    worker.set_loss_fn(partial(ppo_loss, config=actor))
    return worker


def actor_update(model_dir: str, run: dict) -> dict:
    """One ``train_mini_batch`` (EPOCHS epochs over one mini-batch) as RayPPOTrainer prepares it."""
    from verl import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    worker = make_worker(model_dir, run)
    tensors = batch_tensors()
    mask = tensors["response_mask"]
    batch = DataProto.from_dict(tensors=tensors)
    infer = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(infer, calculate_entropy=False, compute_loss=False, temperature=1.0)
    own = no_padding_2_padding(tu.get(worker.infer_batch(infer), "log_probs"), infer).float() * mask
    shift = torch.zeros(RESPONSE)
    for position, amount in run.get("shift", {}).items():
        shift[int(position)] = float(amount)
    old = (own - shift[None]) * mask
    train = left_right_2_no_padding(batch.to_tensordict())
    train["old_log_probs"] = old
    tu.assign_non_tensor(train, calculate_entropy=False, distillation_use_topk=False, distillation_only=False,
                         global_batch_size=BATCH, mini_batch_size=BATCH, epochs=EPOCHS, seed=42,
                         dataloader_kwargs={"shuffle": False}, compute_loss=True, temperature=1.0)  # fmt: skip
    metrics = tu.get(worker.train_mini_batch(train), "metrics")
    return {"metrics": {k: [float(x) for x in (v if isinstance(v, list) else [v])] for k, v in metrics.items()},
            "own_log_probs": own.tolist(), "old_log_probs": old.tolist()}  # fmt: skip


def main() -> None:
    spec = json.load(sys.stdin)
    save_tiny_llama(spec["model_dir"])
    install_cpu_platform()
    init_process_group()
    import bandcore.rl.verl  # noqa: F401  (registers "bandpo")

    tensors = batch_tensors()
    out = {"runs": {run["name"]: actor_update(spec["model_dir"], run) for run in spec["runs"]},
           "advantages": tensors["advantages"].tolist(),
           "response_mask": tensors["response_mask"].tolist()}  # fmt: skip
    print(json.dumps(out))


if __name__ == "__main__":
    main()
