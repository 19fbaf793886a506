r"""Facts of a generator, exactly where SymPy can and numerically where it cannot.

* :mod:`.symbolic` — the grammar → SymPy bridge and the exact facts of a generator (:func:`.symbolic.facts`);
* :mod:`.branches` — the branch of a piecewise generator active near 0⁺, 1∓, ∞, and numeric facts where SymPy
  fails;
* :mod:`.budget` — time budgets for every SymPy call (any thread);
* :mod:`.mpmath_g` — the one high-precision :math:`g_f` (used by the validation, :mod:`bandcore.oracle`,
  :mod:`bandcore.tables` and :mod:`bandcore.verify`) and the checked facts every other group starts from.

Nothing here imports the other two groups (:mod:`..closed_forms`, :mod:`..codegen`).
"""
