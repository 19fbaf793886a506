#!/usr/bin/env bash
# BandPO with verl 0.9.1 on one node: verl's GRPO trainer with the settings of examples/recipes/verl_bandpo.yaml
# (KL trust region δ = 0.05, upper ratio bound ≤ 10, dual clip 10, seq-mean-token-mean).
#
#     pip install "verl[vllm]==0.9.1" bandcore
#     MODEL_PATH=/models/my-1.5b TRAIN_FILES=/data/train.parquet VAL_FILES=/data/test.parquet \
#         bash examples/recipes/verl_bandpo.sh [more hydra overrides]
#
# The data files are verl's RL parquet format (verl's examples/data_preprocess); MODEL_PATH is a local Hugging Face
# checkpoint. GPUS (default 8) is the number of GPUs of the node. Extra arguments are hydra overrides, e.g.
# actor_rollout_ref.actor.policy_loss.band_delta=0.1 or trainer.total_epochs=3. A multi-node launch with the same
# recipe: examples/verl_bandpo.sh.
set -euo pipefail

RECIPES="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${MODEL_PATH:?set MODEL_PATH}" "${TRAIN_FILES:?set TRAIN_FILES}" "${VAL_FILES:?set VAL_FILES}"

exec python3 -m verl.trainer.main_ppo --config-path="${RECIPES}" --config-name=verl_bandpo \
  data.train_files="${TRAIN_FILES}" \
  data.val_files="${VAL_FILES}" \
  data.train_batch_size="${BATCH:-256}" \
  data.max_prompt_length="${MAX_PROMPT:-1024}" \
  data.max_response_length="${MAX_RESPONSE:-4096}" \
  actor_rollout_ref.model.path="${MODEL_PATH}" \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=64 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.tensor_model_parallel_size="${TP:-2}" \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
  trainer.nnodes=1 \
  trainer.n_gpus_per_node="${GPUS:-8}" \
  trainer.total_epochs=1 \
  trainer.project_name=bandpo \
  trainer.experiment_name="bandpo-kl-0.05" \
  trainer.logger='["console"]' \
  "$@"
