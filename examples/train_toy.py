"""Train a tiny policy with BandPO on the reversal task, on the CPU, in about a minute.

    python examples/train_toy.py --out /tmp/bandpo_toy [--method clip] [--steps 30]

The same run from the command line: ``bandcore train --out /tmp/bandpo_toy --method band --steps 30``.
The three-method comparison with plots: ``bandcore train --compare --quick --out /tmp/bandpo_compare``.
"""

from __future__ import annotations

import argparse

from experiments.toy import TrainConfig, read_metrics, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--method", default="band", choices=("band", "clip", "clip-higher"))
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()

    # the task: reverse a 4-digit string; the warm-up makes "copy it" the habit and reversal a rare branch
    config = TrainConfig(task="reverse", digits=4, demo_correct=0.1, method=args.method, divergence="kl",
                         delta=0.05, steps=args.steps)
    run(config, args.out)
    lines = read_metrics(f"{args.out}/metrics.jsonl")
    start, last = lines[0], lines[-1]  # line 0: the warmed-up policy; last: after RL
    for name in ("eval_reward", "eval_pass_at_k", "eval_entropy"):
        print(f"{name:>15}: {start[name]:.3f} -> {last[name]:.3f}")


if __name__ == "__main__":
    main()
