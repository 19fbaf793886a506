"""OpenRLHF on the CPU, for the tests of bandcore.rl.openrlhf and bandcore.rl.openrlhf_launch (a helper module).

OpenRLHF 0.11.2 is installed without its dependencies (``.ci/run``: a virtual environment of its own, with
DeepSpeed, flash-attn's Python package built without its CUDA kernels, and the few pure-Python packages its modules
import).  Two GPU-only imports cannot be installed on a CPU, so test-only stand-ins live here and only here
(``openrlhf_shims/``, never in the library):

* ``cuda/flash_attn_2_cuda.py``: flash-attn's compiled extension, imported by ``flash_attn/__init__.py``, itself
  imported at the top of ``openrlhf.models`` (for its padding helpers); no kernel is ever called;
* ``gpu_only/vllm``: vLLM, imported at the top of ``openrlhf.trainer.ray`` (so by the actor's module); only the
  three names that module imports, and it is put on the path of subprocesses only (never of the test process).

Everything else is OpenRLHF's, DeepSpeed's and Ray's own code.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIMS = Path(__file__).resolve().parent / "openrlhf_shims"
CUDA_SHIM, GPU_ONLY_SHIM = SHIMS / "cuda", SHIMS / "gpu_only"


def _missing(module: str) -> bool:
    """True when ``module`` is not installed (its stand-in, once on this process's path, does not count)."""
    spec = importlib.util.find_spec(module)
    return spec is None or SHIMS in Path(spec.origin or "").parents


def openrlhf_installed() -> bool:
    return importlib.util.find_spec("openrlhf") is not None


def _quiet_import(name: str) -> ModuleType:
    with warnings.catch_warnings():
        # DeepSpeed imports torch's inductor, which imports torch.utils.mkldnn: torch's own DeprecationWarning
        # (torch.jit.script_method)
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module(name)


def import_openrlhf_loss() -> ModuleType:
    """``openrlhf.models.loss`` (the flash-attn kernels' stand-in on the path if they are missing); skips the
    calling test module when OpenRLHF is not installed."""
    if not openrlhf_installed():
        pytest.skip("OpenRLHF is not installed (.ci/run installs it in an environment of its own)",
                    allow_module_level=True)
    if _missing("flash_attn_2_cuda") and str(CUDA_SHIM) not in sys.path:
        sys.path.append(str(CUDA_SHIM))
    return _quiet_import("openrlhf.models.loss")


def import_plugin() -> ModuleType:
    """``bandcore.rl.openrlhf`` (after :func:`import_openrlhf_loss`)."""
    import_openrlhf_loss()
    return _quiet_import("bandcore.rl.openrlhf")


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of a subprocess that imports OpenRLHF's Ray modules the way a worker does: this checkout
    first on the path, then the stand-ins of the GPU-only imports that are not installed."""
    paths = [str(ROOT)]
    if _missing("flash_attn_2_cuda"):
        paths.append(str(CUDA_SHIM))
    if _missing("vllm"):
        paths.append(str(GPU_ONLY_SHIM))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **extra}
    env["PYTHONWARNINGS"] = "ignore::DeprecationWarning"
    return env


def actor_module_path() -> Path:
    """OpenRLHF's ``openrlhf/trainer/ray/ppo_actor.py`` (found without importing its package)."""
    (location,) = importlib.util.find_spec("openrlhf").submodule_search_locations
    return Path(location) / "trainer" / "ray" / "ppo_actor.py"


def train_module_path() -> Path:
    """OpenRLHF's ``openrlhf/cli/train_ppo_ray.py``."""
    (location,) = importlib.util.find_spec("openrlhf").submodule_search_locations
    return Path(location) / "cli" / "train_ppo_ray.py"
