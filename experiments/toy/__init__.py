"""A small GRPO / BandPO trainer on verifiable toy tasks, behind ``bandcore train``.

- :mod:`.config`: :class:`TrainConfig`, every setting with its help text and constraint (the CLI is generated
  from it);
- :mod:`.tasks`: the verifiable tasks (``reverse``, ``add``) and their warm-up demonstrations;
- :mod:`.model`: the policy (a tiny Llama built locally, or a local Hugging Face directory);
- :mod:`.rollout`: sampling, log-probabilities, advantages, warm-up and evaluation;
- :mod:`.train`: one RL step and a whole run (:func:`run`), checkpoints, resume;
- :mod:`.buckets`: clip fractions by side and old-probability bucket (training metrics);
- :mod:`.stats`: means with Student-t intervals and paired differences over seeds;
- :mod:`.compare`: clip / clip-higher / band-kl over several seeds, the summary, its table and the plots.

``compare`` imports ``train``, never the reverse.  Importing this package imports nothing; the names below are
loaded on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .compare import compare
    from .config import TrainConfig
    from .train import read_metrics, run

__all__ = ["TrainConfig", "compare", "read_metrics", "run"]

_LAZY = {"TrainConfig": "config", "compare": "compare", "read_metrics": "train", "run": "train"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
