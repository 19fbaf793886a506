#!/usr/bin/env bash
# BandPO in TRL: examples/trl_grpo.py (a tiny Llama on a verifiable task, CPU, no download) at BandPO's published
# settings: KL trust region δ = 0.05, upper ratio bound ≤ 10, dual clip 10 (TRL's `delta`), loss_type grpo (mean
# over a sequence's tokens, then over sequences: seq-mean-token-mean).
#
#     bash examples/recipes/trl_bandpo.sh [--out runs/trl_bandpo] [--max-steps 160] [other trl_grpo.py options]
#
# For your own model and data, the same settings are four fields of bandcore.rl.trl.BandGRPOConfig:
#     BandGRPOConfig(..., band_divergence="kl", band_delta=0.05, band_max_ratio=10.0, delta=10.0, loss_type="grpo")
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
exec "${PYTHON:-python}" "${ROOT}/examples/trl_grpo.py" --out runs/trl_bandpo \
  --divergence kl --delta 0.05 --max-ratio 10 --dual-clip 10 --loss-type grpo "$@"
