"""bandcore: the Band — probability-aware trust-region clipping for RL on language models.

The Band of a token with old probability p is the exact interval of probability ratios r = π/π_old that
keeps the whole next-token distribution inside an f-divergence trust region D_f(π‖π_old) <= δ.

>>> import bandcore as bc
>>> lower, upper = bc.band(np.log([0.08, 0.5]), "kl", delta=0.05)      # doctest: +SKIP

The public functions are imported eagerly: a lazily bound ``band``/``derive``/``verify`` would be replaced by
the submodule of the same name as soon as anything imported that submodule.
"""

from .band import band, band_log
from .derive import Derivation, derive
from .divergences import Divergence, GeneratorError, get_divergence, list_divergences
from .tables import BandTable
from .verify import VerificationReport, verify

__version__ = "0.1.0"

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
