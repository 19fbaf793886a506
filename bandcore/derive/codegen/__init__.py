r"""Code and plans generated from a generator for the other layers.

* :mod:`.kernel_functions` — the solver functions (cancellation-free :math:`\Phi, \tilde f', \tilde f,
  u\tilde f'` with Taylor and far branches), with :mod:`.selects` (piecewise generators as element-wise
  selects) and :mod:`.overflow` (exponentials without overflow);
* :mod:`.table_pieces` — the lookup tables' closed pieces (:mod:`bandcore.tables`);
* :mod:`.dcp_plan` — the generator as disciplined-convex atoms (:mod:`bandcore.verify`).
"""
