"""bandcore: the Band — probability-aware trust-region clipping for RL on language models.

The Band of a token with old probability p is the exact interval of probability ratios r = π/π_old that
keeps the whole next-token distribution inside an f-divergence trust region D_f(π‖π_old) <= δ.

>>> import numpy as np, bandcore as bc
>>> lower, upper = bc.band(np.log([0.08, 0.5]), "kl", delta=0.05)

The public names are bound lazily (PEP 562): ``import bandcore`` loads NumPy only; SymPy, CVXPY, Numba,
torch and matplotlib are imported by the stage that needs them.  The functions ``band``, ``derive`` and
``verify`` share their names with the submodules that define them; the package keeps the functions bound
(import a submodule with ``from bandcore.band import band_log`` or ``importlib.import_module``).
"""

from __future__ import annotations

import sys
import types
from importlib import import_module
from typing import Any

__version__ = "0.2.0"

# public name -> (module, attribute)
_PUBLIC: dict[str, tuple[str, str]] = {
    "BandTable": ("bandcore.tables", "BandTable"),
    "Derivation": ("bandcore.derive", "Derivation"),
    "Divergence": ("bandcore.divergences", "Divergence"),
    "GeneratorError": ("bandcore.divergences", "GeneratorError"),
    "Status": ("bandcore._contract", "Status"),
    "VerificationReport": ("bandcore.verify", "VerificationReport"),
    "band": ("bandcore.band", "band"),
    "band_log": ("bandcore.band", "band_log"),
    "bind": ("bandcore.band", "bind"),
    "derive": ("bandcore.derive", "derive"),
    "get_divergence": ("bandcore.divergences", "get_divergence"),
    "list_divergences": ("bandcore.divergences", "list_divergences"),
    "resolve": ("bandcore.divergences", "resolve"),
    "resolve_region": ("bandcore.divergences", "resolve_region"),
    "verify": ("bandcore.verify", "verify"),
}

__all__ = sorted([*_PUBLIC, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        module, attribute = _PUBLIC[name]
        value = getattr(import_module(module), attribute)
        object.__setattr__(sys.modules[__name__], name, value)
        return value
    raise AttributeError(f"module 'bandcore' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


class _Package(types.ModuleType):
    """Keeps ``bandcore.band`` / ``.derive`` / ``.verify`` the functions when their submodules are imported."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _PUBLIC and isinstance(value, types.ModuleType):
            return  # the import system binding the submodule; the public function keeps the name
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
