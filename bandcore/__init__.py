"""bandcore: the Band — probability-aware trust-region clipping for RL on language models.

The Band of a token with old probability p is the exact interval of probability ratios r = π/π_old that
keeps the whole next-token distribution inside an f-divergence trust region D_f(π‖π_old) <= δ.

>>> import bandcore as bc
>>> lower, upper = bc.band(old_log_prob, "kl", delta=0.05)      # doctest: +SKIP
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .band import band, band_log  # eager (numpy only): a lazy `band` would be shadowed by the submodule
from .divergences import Divergence, GeneratorError, get_divergence, list_divergences

__version__ = "0.1.0"

# Heavy stages (SymPy solving, CVXPY, Numba) are imported on first use so `import bandcore` stays fast.
_LAZY = {
    "derive": "bandcore.derive",
    "Derivation": "bandcore.derive",
    "verify": "bandcore.verify",
    "VerificationReport": "bandcore.verify",
    "BandTable": "bandcore.tables",
}

__all__ = [
    "BandTable",
    "Derivation",
    "Divergence",
    "GeneratorError",
    "VerificationReport",
    "__version__",
    "band",
    "band_log",
    "derive",
    "get_divergence",
    "list_divergences",
    "verify",
]

if TYPE_CHECKING:
    from .band import band, band_log
    from .derive import Derivation, derive
    from .tables import BandTable
    from .verify import VerificationReport, verify


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bandcore' has no attribute {name!r}")
