"""The benchmark of bandcore against the published BandPO solver and a memory copy (run from a source checkout).

``python -m benchmarks`` (or ``bandcore bench`` in an editable install) runs :func:`benchmarks.bench.run_bench`
and prints the report; :mod:`benchmarks.cli` has the options.  Not part of the wheel: the library never imports it.
"""
