"""BandGRPOTrainer under two CPU processes (``accelerate launch``, gloo): the ranks agree with each other and
with a single-process computation.

``accelerate launch --cpu`` starts more than one process only through MPI (``mpirun``), which this environment
lacks; ``--multi_gpu`` selects accelerate's torchrun launcher instead, and the config's ``use_cpu=True`` (with no
visible GPU) makes the process group a CPU one with the gloo backend, which the script records and the test checks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "trl_grpo.py"

# Run as ``accelerate launch ... script.py EXAMPLE OUT`` on every rank; imported by the test for the reference.
SCRIPT = textwrap.dedent('''
    import importlib.util
    import json
    import sys
    import warnings
    from pathlib import Path

    import torch
    from datasets import Dataset

    from bandcore.rl.trl import BandGRPOConfig, BandGRPOTrainer


    def load_example(path):
        spec = importlib.util.spec_from_file_location("trl_grpo_example", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


    def build_trainer(example, out, max_steps=2):
        tokenizer = example.build_tokenizer()
        config = BandGRPOConfig(
            output_dir=str(out), loss_type="bnpo", num_iterations=2, per_device_train_batch_size=4,
            num_generations=2, max_completion_length=4, beta=0.0, max_steps=max_steps, learning_rate=0.05,
            logging_steps=1, seed=0, use_cpu=True, bf16=False, activation_checkpointing=False, report_to="none",
            save_strategy="no", disable_tqdm=True,
        )
        words = example.WORDS
        dataset = Dataset.from_dict({"prompt": [f"say {w}" for w in words], "target": list(words)})
        return BandGRPOTrainer(model=example.build_model(tokenizer, seed=0), reward_funcs=example.say_reward,
                               args=config, train_dataset=dataset, processing_class=tokenizer)


    def fixed_batch(trainer):
        """A micro-batch, the same on every rank, with old probabilities spread over (0.01, 0.99)."""
        tok = trainer.processing_class
        gen = torch.Generator().manual_seed(5)
        prompt_ids = torch.tensor([tok.convert_tokens_to_ids(["say", w]) for w in ("red", "cat", "sun", "dog")])
        completion_ids = torch.randint(4, len(tok), (4, 5), generator=gen)
        completion_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]])
        old = torch.log(0.01 + 0.98 * torch.rand((4, 5), generator=gen))
        return {
            "prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion_ids,
            "completion_mask": completion_mask, "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]),
            "old_per_token_logps": old, "num_items_in_batch": completion_mask.sum(),
        }


    def evaluate(trainer):
        """(lower, upper, loss) on the fixed batch, through the trainer's bound path and TRL's loss."""
        trainer.model.eval()
        inputs = fixed_batch(trainer)
        lower, upper = trainer.band_ratio_bounds(inputs["old_per_token_logps"])
        with torch.no_grad():
            loss = trainer._compute_loss(trainer.model, inputs)
        return lower.tolist(), upper.tolist(), float(loss)


    def main(example_path, out):
        warnings.simplefilter("ignore")
        out = Path(out)
        trainer = build_trainer(load_example(example_path), out)
        trainer.train()
        rank = trainer.accelerator.process_index
        lower, upper, loss = evaluate(trainer)
        params = [p.detach().double() for p in trainer.model.parameters()]
        log = [e for e in trainer.state.log_history if "loss" in e]
        if rank == 0:
            torch.save(trainer.model.state_dict(), out / "model.pt")
        record = {
            "rank": rank, "world_size": trainer.accelerator.num_processes,
            "backend": torch.distributed.get_backend(), "device": str(trainer.accelerator.device),
            "lower": lower, "upper": upper,
            "loss": loss, "param_sum": sum(float(p.sum()) for p in params),
            "param_abs_sum": sum(float(p.abs().sum()) for p in params),
            "width": [e["band/width_mean"] for e in log], "band_low": [e["band/clip_ratio/low"] for e in log],
        }
        (out / f"rank{rank}.json").write_text(json.dumps(record))


    if __name__ == "__main__":
        main(sys.argv[1], sys.argv[2])
''')


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_cpu_processes_agree_with_each_other_and_with_one_process(tmp_path):
    script = tmp_path / "band_mp.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "ACCELERATE_CONFIG_FILE": str(tmp_path / "no_accelerate_config.yaml")}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(_free_port()), str(script), str(EXAMPLE), str(out)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=400, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world_size"] == 2 for r in ranks)
    assert all(r["backend"] == "gloo" and r["device"].startswith("cpu") for r in ranks)
    first, second = ranks
    # identical bounds, weights after two synchronised steps, loss and reduced metrics on both ranks
    assert first["lower"] == second["lower"] and first["upper"] == second["upper"]
    assert first["param_sum"] == second["param_sum"] and first["param_abs_sum"] == second["param_abs_sum"]
    assert first["loss"] == second["loss"]
    assert first["width"] == second["width"] and first["band_low"] == second["band_low"]
    assert len(first["width"]) == 2

    # the same batch in this (single) process, with the weights rank 0 trained
    spec = importlib.util.spec_from_file_location("band_mp", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    trainer = module.build_trainer(module.load_example(EXAMPLE), tmp_path / "single")
    assert trainer.accelerator.num_processes == 1
    trainer.model.load_state_dict(torch.load(out / "model.pt"))
    lower, upper, loss = module.evaluate(trainer)
    torch.testing.assert_close(torch.tensor(lower), torch.tensor(first["lower"]), rtol=0, atol=0)
    torch.testing.assert_close(torch.tensor(upper), torch.tensor(first["upper"]), rtol=0, atol=0)
    assert loss == pytest.approx(first["loss"], abs=1e-6, rel=0)
    assert torch.tensor(upper).gt(1).all() and torch.tensor(lower).lt(1).all()
