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

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "trl_grpo.py"

# Run as ``accelerate launch ... script.py EXAMPLE OUT`` on every rank; imported by the test for the reference.
SCRIPT = textwrap.dedent('''
    import importlib.util
    import json
    import sys
    import warnings
    from pathlib import Path

    import torch

    from bandcore.rl.trl import BandGRPOConfig, BandGRPOTrainer

    BAND_KEYS = ("band/width_mean", "band/clip_ratio/low", "band/clip_ratio/high", "band/clip_ratio/region",
                 "band/clip_ratio_fixed/region_mean", "band/clip_ratio/p0.01-0.1", "band/clip_ratio/p0.1-0.5",
                 "band/clip_ratio/p>=0.5", "clip_ratio/region_mean")


    def load_example(path):
        spec = importlib.util.spec_from_file_location("trl_grpo_example", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


    def build_trainer(example, out, max_steps=2):
        task = example.make_task("reverse")
        tokenizer = example.build_tokenizer(task)
        config = BandGRPOConfig(  # loss_type dapo: the loss is normalised by the token count of all processes
            output_dir=str(out), loss_type="dapo", num_iterations=2, per_device_train_batch_size=4,
            num_generations=2, max_completion_length=task.max_new_tokens, beta=0.0, max_steps=max_steps,
            learning_rate=0.05, logging_steps=1, seed=0, **example.cpu_settings(),
        )
        return BandGRPOTrainer(model=example.build_model(tokenizer, seed=0), reward_funcs=example.digit_match,
                               args=config, train_dataset=example.build_dataset(task, 64, seed=0),
                               processing_class=tokenizer)


    def fixed_batch(trainer):
        """An 8-row micro-batch, the same on every rank, with old probabilities spread over (0.01, 0.99)."""
        tok = trainer.processing_class
        gen = torch.Generator().manual_seed(5)
        prompts = ["4721=", "1203=", "9981=", "5620=", "3141=", "2718=", "1618=", "8080="]
        prompt_ids = torch.tensor(tok(prompts)["input_ids"])
        completion_ids = torch.randint(3, len(tok), (8, 5), generator=gen)
        lengths = torch.tensor([5, 3, 4, 1, 5, 2, 5, 4])
        completion_mask = (torch.arange(5)[None, :] < lengths[:, None]).long()
        old = torch.log(0.01 + 0.98 * torch.rand((8, 5), generator=gen))
        return {
            "prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion_ids,
            "completion_mask": completion_mask, "old_per_token_logps": old,
            "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.3, -0.1]),
            "num_items_in_batch": completion_mask.sum(),
        }


    def evaluate(trainer):
        """This process's share of the fixed batch through TRL's loss and the (DDP-wrapped) model.

        Returns the bounds of the whole batch and of this process's rows, the loss averaged over the processes,
        the gradient after backward (DDP averages it over the processes) and the Band's metrics (reduced over
        the processes).  With one process the share is the whole batch.
        """
        trainer.model.eval()  # TRL's eval normaliser (no accumulation); the Llama has no dropout
        accelerator = trainer.accelerator
        batch = fixed_batch(trainer)
        rows = slice(8 * accelerator.process_index // accelerator.num_processes,
                     8 * (accelerator.process_index + 1) // accelerator.num_processes)
        share = {key: value if key == "num_items_in_batch" else value[rows] for key, value in batch.items()}
        lower, upper = trainer.band_ratio_bounds(batch["old_per_token_logps"])
        share_lower, share_upper = trainer.band_ratio_bounds(share["old_per_token_logps"])
        trainer.model.zero_grad(set_to_none=True)
        loss = trainer._compute_loss(trainer.model_wrapped, share)
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in trainer.model.parameters()])
        metrics = {key: trainer._metrics["eval"][key][-1] for key in BAND_KEYS}
        return {"lower": lower.tolist(), "upper": upper.tolist(), "share_lower": share_lower.tolist(),
                "share_upper": share_upper.tolist(), "loss": float(accelerator.reduce(loss.detach(), "mean")),
                "grad": grads.tolist(), "metrics": metrics}


    def main(example_path, out):
        warnings.simplefilter("ignore")
        out = Path(out)
        trainer = build_trainer(load_example(example_path), out)
        trainer.train()
        rank = trainer.accelerator.process_index
        params = [p.detach().double() for p in trainer.model.parameters()]
        log = [e for e in trainer.state.log_history if "loss" in e]
        if rank == 0:
            torch.save(trainer.model.state_dict(), out / "model.pt")
        record = {
            "rank": rank, "world_size": trainer.accelerator.num_processes,
            "backend": torch.distributed.get_backend(), "device": str(trainer.accelerator.device),
            "ddp": type(trainer.model_wrapped).__name__,
            "param_sum": sum(float(p.sum()) for p in params),
            "param_abs_sum": sum(float(p.abs().sum()) for p in params),
            "width": [e["band/width_mean"] for e in log], "band_low": [e["band/clip_ratio/low"] for e in log],
            **evaluate(trainer),
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
    assert first["ddp"] == second["ddp"] == "DistributedDataParallel"
    # identical weights after two synchronised steps, and identical reduced metrics, on both ranks
    assert first["param_sum"] == second["param_sum"] and first["param_abs_sum"] == second["param_abs_sum"]
    assert first["width"] == second["width"] and first["band_low"] == second["band_low"]
    assert len(first["width"]) == 2
    # the same old probabilities give the same bounds on both ranks; each rank bounded its own rows
    assert first["lower"] == second["lower"] and first["upper"] == second["upper"]
    assert first["share_lower"] + second["share_lower"] == first["lower"]
    assert first["share_upper"] + second["share_upper"] == first["upper"]
    # the loss and the gradient are global: every rank holds the same after the reduction / DDP's all-reduce
    assert first["loss"] == second["loss"] and first["metrics"] == second["metrics"]
    torch.testing.assert_close(torch.tensor(first["grad"]), torch.tensor(second["grad"]), rtol=0, atol=0)

    # the whole batch in this (single) process, with the weights rank 0 trained
    spec = importlib.util.spec_from_file_location("band_mp", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    trainer = module.build_trainer(module.load_example(EXAMPLE), tmp_path / "single")
    assert trainer.accelerator.num_processes == 1
    trainer.model.load_state_dict(torch.load(out / "model.pt"))
    single = module.evaluate(trainer)
    assert single["lower"] == first["lower"] and single["upper"] == first["upper"]
    assert torch.tensor(single["upper"]).gt(1).all() and torch.tensor(single["lower"]).lt(1).all()
    # two processes with half the rows each = one process with all of them: loss, gradient, Band metrics
    assert first["loss"] == pytest.approx(single["loss"], rel=1e-5, abs=1e-7)
    torch.testing.assert_close(torch.tensor(first["grad"]), torch.tensor(single["grad"]), rtol=1e-4, atol=1e-6)
    assert torch.tensor(single["grad"]).abs().max() > 1e-3  # the gradient is not trivially 0
    for key, value in single["metrics"].items():
        assert first["metrics"][key] == pytest.approx(value, abs=1e-6), key
    assert single["metrics"]["band/clip_ratio/region"] > 0  # the Band clips in this batch
