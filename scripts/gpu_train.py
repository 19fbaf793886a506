"""A prepared GPU run of the small trainer: a larger model, a few hundred steps, the Band's cost fraction.

    python scripts/gpu_train.py --out runs/gpu            # on a CUDA machine (defaults below)
    python scripts/gpu_train.py --out /tmp/smoke --device cpu --size tiny --steps 2 --warmup-steps 5 \
        --habit-steps 2 --prompts-per-step 4   # a CPU smoke test of this script

It trains band-kl (δ = 0.05) on the addition task (``add``: two 3-digit numbers, the carry-forgetting habit),
with the ``medium`` Llama (512 wide, 8 layers, ~25 M parameters), 64 prompts × 8 completions per step,
4 passes of 4 minibatches, and prints: the final evaluation, the mean step time, the mean time of the Band's
bound computation per batch, and the Band's cost as a fraction of a training step (the target is < 1 %).
Every setting of ``bandcore train`` can be given (the options are generated from the same ``TrainConfig``);
see ``bandcore train --help``.  ``--resume`` continues a run, ``--new-run`` overwrites one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

import torch

from bandcore.cli.train import add_config_options
from experiments.toy.config import TrainConfig
from experiments.toy.train import read_metrics, run

GPU_DEFAULTS = {
    "task": "add", "digits": 3, "size": "medium", "device": "cuda", "method": "band", "divergence": "kl",
    "delta": 0.05, "steps": 300, "prompts_per_step": 64, "group_size": 8, "ppo_epochs": 4, "minibatches": 4,
    "lr": 1e-4, "warmup_steps": 1500, "habit_steps": 300, "warmup_batch": 256, "warmup_lr": 5e-4,
    "eval_prompts": 256, "eval_k": 8, "eval_every": 50, "save_every": 50,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--out", required=True)
    parser.add_argument("--resume", action="store_true", help="continue OUT/checkpoint.pt")
    parser.add_argument("--new-run", action="store_true", dest="new_run", help="overwrite a run in OUT")
    add_config_options(parser, TrainConfig)
    args = parser.parse_args(argv)
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if hasattr(args, f.name)}
    try:
        config = TrainConfig(**{**GPU_DEFAULTS, **given})
    except (ValueError, TypeError) as err:
        hint = " (pass --device cpu for a smoke test)" if "device" in str(err) else ""
        print(f"gpu_train: error: {err}{hint}", file=sys.stderr)
        return 2
    if config.device.startswith("cuda"):
        print(f"device: {torch.cuda.get_device_name(config.device)}")
    started = time.perf_counter()
    try:
        run(config, args.out, resume=args.resume, new_run=args.new_run, threads=None)
    except ValueError as err:
        print(f"gpu_train: error: {err}", file=sys.stderr)
        return 2
    lines = [line for line in read_metrics(f"{args.out}/metrics.jsonl") if line["step"] > 0]
    steady = lines[1:] or lines  # the first step includes one-off compilation and allocation
    report = {
        "steps": len(lines),
        "wall_time_s": time.perf_counter() - started,
        "mean_step_s": statistics.fmean(line["time_step_s"] for line in steady),
        "mean_band_call_s": statistics.fmean(line["time_band_s"] for line in steady),
        "band_cost_frac": statistics.fmean(line["band_cost_frac"] for line in steady),
        "final": {k: v for k, v in lines[-1].items() if k.startswith("eval_")},
        "start": {k: v for k, v in read_metrics(f"{args.out}/metrics.jsonl")[0].items() if k.startswith("eval_")},
    }
    print(json.dumps(report, indent=2))
    print(f"Band cost: {100 * report['band_cost_frac']:.3f} % of a training step "
          f"({config.ppo_epochs * config.minibatches} loss calls per step)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
