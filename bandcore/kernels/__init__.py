"""The Band solvers, written once (:mod:`.solvers`) and bound to NumPy, torch or Numba (:func:`.backends.bind`).

:mod:`.ops` and :mod:`.numba_ops` / :mod:`.numba_fast_ops` are the element-wise namespaces the solver source
is written against.  The public wrapper, with every input check, is :mod:`bandcore.band`.
"""
