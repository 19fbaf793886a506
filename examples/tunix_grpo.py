"""GRPO with the Band in Tunix (JAX), on the CPU with a toy model: ``python examples/tunix_grpo.py``.

Tunix's own GRPO learner, rollout and optimizer; the only change is the config: ``BandGRPOConfig`` selects the
``band_grpo`` loss that ``import bandcore.rl.tunix`` registered in Tunix's registry, and carries the Band's
settings.  The model and vocabulary are Tunix's test toys (``tunix.tests.test_common``: a two-layer transformer
with 16-wide embeddings, a 22-word vocabulary), so nothing is downloaded; the reward is the fraction of the word
"hello" in a completion.  Prints, per step, the mean reward and Tunix's own loss metrics (``pg_clipfrac``:
tokens clipped at the Band's bounds) and the Band's width, and with ``--out`` writes them to a JSON file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import numpy as np
import optax
from flax import nnx
from grain import python as grain
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo.grpo_learner import GRPOLearner
from tunix.rl.rollout import base_rollout
from tunix.tests import test_common as toys

from bandcore.rl.tunix import BandGRPOConfig

PROMPTS = ["input string", "hello world", "My name", "hello there", "Tunix library", "distributed training"]
#: metrics of Tunix's loss (and the Band's) kept per step
LOSS_METRICS = ("pg_clipfrac", "band/width_mean", "ppo_kl")


def reward_hello(prompts, completions, **kwargs):
    """Fraction of the words of each completion that are "hello"."""
    return [float(np.mean([w == "hello" for w in c.split()])) if c.split() else 0.0 for c in completions]


def build(args):
    """(learner, rewards seen per step, loss metrics per step)."""
    vocab = toys.MockVocab()
    config = toys.ModelConfig(vocab_size=vocab.GetPieceSize())
    actor = toys.ToyTransformer(config=config, rngs=nnx.Rngs(args.seed))
    reference = toys.ToyTransformer(config=config, rngs=nnx.Rngs(args.seed))
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    cluster = rl_cluster_lib.RLCluster(
        actor=actor,
        reference=reference,
        tokenizer=vocab,
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={role: mesh for role in rl_cluster_lib.Role},
            rollout_engine="vanilla",
            offload_to_cpu=False,
            training_config=rl_cluster_lib.RLTrainingConfig(
                actor_optimizer=optax.adam(args.lr), eval_every_n_steps=10**6, max_steps=args.steps
            ),
            rollout_config=base_rollout.RolloutConfig(
                max_tokens_to_generate=8, max_prompt_length=8, kv_cache_size=64, temperature=1.0
            ),
        ),
    )
    algo = BandGRPOConfig(num_generations=4, num_iterations=2, beta=0.0, band_divergence=args.divergence,
                          band_delta=args.delta, band_max_ratio=10.0, epsilon_c=10.0)  # fmt: skip
    rewards: list[float] = []

    def reward(prompts, completions, **kwargs):
        values = reward_hello(prompts, completions)
        rewards.append(float(np.mean(values)))
        return values

    learner = GRPOLearner(rl_cluster=cluster, algo_config=algo, reward_fns=[reward])
    cluster.actor_trainer.with_rl_metrics_to_log({name: np.mean for name in ("kl", *LOSS_METRICS)})
    return learner, rewards


def dataset(batch: int):
    return grain.MapDataset.source(PROMPTS * 50).batch(batch).map(lambda x: {"prompts": x})


def history(learner, name: str) -> list[float]:
    logger = learner.rl_cluster.actor_trainer.metrics_logger
    return [float(v) for v in logger.get_metric_history("actor", name, "train")]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--divergence", default="kl")
    parser.add_argument("--delta", type=float, default=0.05)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    learner, rewards = build(args)
    learner.train(dataset(2))
    log = {"reward": rewards, **{name: history(learner, name) for name in ("loss", *LOSS_METRICS)}}
    for step, value in enumerate(log["loss"]):
        print(f"step {step:3d}  loss {value:+.4f}  " + "  ".join(
            f"{name} {log[name][step]:.4f}" for name in LOSS_METRICS if step < len(log[name])))  # fmt: skip
    print(f"mean reward: first generation {rewards[0]:.3f}, last {rewards[-1]:.3f}")
    if args.out is not None:
        args.out.write_text(json.dumps(log, indent=1))
    return log


if __name__ == "__main__":
    main()
