#!/usr/bin/env bash
# BandPO with OpenRLHF 0.11.2 on one node: OpenRLHF's own train_ppo_ray, launched through bandcore's launcher so
# that every Ray worker builds the Band's policy loss (no edit of OpenRLHF), at BandPO's published settings:
# KL trust region δ = 0.05, upper ratio bound ≤ 10, dual clip 10, seq-mean-token-mean, GRPO advantages.
#
#     pip install "openrlhf[vllm]==0.11.2" "bandcore[openrlhf]"
#     MODEL_PATH=/models/my-1.5b PROMPTS=/data/train.jsonl REWARD=/path/to/reward_func.py \
#         bash examples/recipes/openrlhf_bandpo.sh [more train_ppo_ray or --actor.band_* flags]
#
# PROMPTS is an OpenRLHF prompt dataset (a local path or a dataset name; INPUT_KEY / LABEL_KEY name its fields),
# REWARD is OpenRLHF's --reward.remote_url (a reward server's URL or a Python file with reward_func). GPUS
# (default 8) is the number of GPUs of the node, colocated for the actor, the reference and the vLLM engines.
# Each rollout batch (128 prompts x 8 samples) is used in 4 optimizer steps of 256, so the ratio moves and the
# Band acts; extra flags override, e.g. --actor.band_delta 0.1 or --actor.band_divergence js.
set -euo pipefail

: "${MODEL_PATH:?set MODEL_PATH}" "${PROMPTS:?set PROMPTS}" "${REWARD:?set REWARD}"

exec "${PYTHON:-python3}" -m bandcore.rl.openrlhf_launch \
  --actor.band_divergence kl \
  --actor.band_delta 0.05 \
  --actor.band_max_ratio 10 \
  --actor.dual_clip 10 \
  --actor.loss_agg_mode seq-mean-token-mean \
  --algo.advantage.estimator group_norm \
  --rollout.n_samples_per_prompt 8 \
  --rollout.batch_size 128 \
  --train.batch_size 256 \
  --train.max_epochs 1 \
  --train.micro_batch_size 4 \
  --rollout.micro_batch_size 8 \
  --rollout.max_new_tokens "${MAX_RESPONSE:-4096}" \
  --data.max_len "${MAX_LEN:-5120}" \
  --rollout.temperature 1.0 \
  --actor.model_name_or_path "${MODEL_PATH}" \
  --data.prompt_dataset "${PROMPTS}" \
  --data.input_key "${INPUT_KEY:-prompt}" \
  --data.label_key "${LABEL_KEY:-answer}" \
  --data.apply_chat_template \
  --reward.remote_url "${REWARD}" \
  --actor.num_nodes 1 \
  --actor.num_gpus_per_node "${GPUS:-8}" \
  --ref.num_nodes 1 \
  --ref.num_gpus_per_node "${GPUS:-8}" \
  --vllm.num_engines "${ENGINES:-4}" \
  --vllm.tensor_parallel_size "${TP:-2}" \
  --vllm.gpu_memory_utilization 0.6 \
  --train.colocate_all \
  --vllm.enable_sleep \
  --ds.enable_sleep \
  --ds.zero_stage 3 \
  --ds.param_dtype bf16 \
  --actor.gradient_checkpointing_enable \
  --actor.adam.lr 1e-6 \
  --ckpt.output_dir "${OUT:-./ckpt/openrlhf_bandpo}" \
  "$@"
