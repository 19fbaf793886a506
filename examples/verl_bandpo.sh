#!/usr/bin/env bash
# BandPO with verl 0.9.1 on a multi-node Ray cluster: bandcore supplies the loss, verl supplies the cluster.
#
# On every node (same Python environment everywhere):
#     pip install "verl[vllm]==0.9.1" bandcore      # bandcore declares the verl.plugins entry point
#
#   1. head node:        HEAD_IP=10.0.0.1 bash examples/verl_bandpo.sh head
#   2. each other node:  HEAD_IP=10.0.0.1 bash examples/verl_bandpo.sh worker
#   3. from the head:    HEAD_IP=10.0.0.1 MODEL_PATH=/models/my-7b TRAIN_FILES=/data/train.parquet \
#                        VAL_FILES=/data/test.parquet NNODES=2 bash examples/verl_bandpo.sh submit
#   4. stop:             bash examples/verl_bandpo.sh stop        (on every node)
#
# The data files are verl's RL parquet format (see verl's examples/data_preprocess). MODEL_PATH is a local
# Hugging Face checkpoint directory readable from every node.
#
# What makes it BandPO is the config examples/recipes/verl_bandpo.yaml (verl's ppo_trainer with the "bandpo" policy
# loss at BandPO's settings: KL δ = 0.05, upper ratio bound ≤ 10, dual clip 10, seq-mean-token-mean, the
# bypass-mode pitfall pinned off, VERL_USE_EXTERNAL_MODULES for every Ray worker); the overrides below are a
# standard verl GRPO run. The head node reads the recipe from this checkout.
# Other band_* keys (docs/rl.md), each with "+": band_loss_form=dppo runs DPPO's objective on the Band (then
#   clip_ratio_c is its truncation C, 20 in DPPO; with band_divergence=kl or tv it is verl's dppo_kl / dppo_tv with
#   clip_ratio_low / clip_ratio_high = band_delta_low / band_delta_high); band_delta_low / band_delta_high set
#   one-sided radii; band_delta_schedule=linear|cosine|exponential with band_delta_end and band_delta_steps moves
#   delta over optimizer steps; band_target_kl adapts it to a measured KL.
set -euo pipefail

RECIPES="$(cd "$(dirname "${BASH_SOURCE[0]}")/recipes" && pwd)"

RAY_PORT=${RAY_PORT:-6379}
DASHBOARD_PORT=${DASHBOARD_PORT:-8265}
NNODES=${NNODES:-2}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}

OVERRIDES=(
  data.train_files="${TRAIN_FILES:-}"
  data.val_files="${VAL_FILES:-}"
  data.train_batch_size=256
  data.max_prompt_length=1024
  data.max_response_length=4096
  actor_rollout_ref.model.path="${MODEL_PATH:-}"
  actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.actor.ppo_mini_batch_size=64
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.tensor_model_parallel_size=2
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
  trainer.nnodes="${NNODES}"
  trainer.n_gpus_per_node="${GPUS_PER_NODE}"
  trainer.total_epochs=1
  trainer.save_freq=50
  trainer.test_freq=10
  trainer.project_name=bandpo
  trainer.experiment_name=bandpo-kl-0.05
  trainer.logger='["console"]'
)

case "${1:-}" in
  head)
    ray start --head --port="${RAY_PORT}" --dashboard-host=0.0.0.0 --dashboard-port="${DASHBOARD_PORT}"
    ;;
  worker)
    ray start --address="${HEAD_IP:?set HEAD_IP to the head node address}:${RAY_PORT}"
    ;;
  submit)
    : "${HEAD_IP:?set HEAD_IP}" "${MODEL_PATH:?set MODEL_PATH}" "${TRAIN_FILES:?set TRAIN_FILES}" "${VAL_FILES:?set VAL_FILES}"
    ray job submit --address="http://${HEAD_IP}:${DASHBOARD_PORT}" --no-wait \
      --runtime-env-json='{"env_vars": {"VERL_USE_EXTERNAL_MODULES": "bandcore.rl.verl"}}' \
      -- python3 -m verl.trainer.main_ppo --config-path="${RECIPES}" --config-name=verl_bandpo "${OVERRIDES[@]}"
    echo "follow it with: ray job logs --address=http://${HEAD_IP}:${DASHBOARD_PORT} --follow <submission id>"
    ;;
  stop)
    ray stop
    ;;
  *)
    echo "usage: HEAD_IP=... $0 head|worker|submit|stop   (see the comments at the top)" >&2
    exit 2
    ;;
esac
