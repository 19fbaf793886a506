"""Experiments built on bandcore, run from a source checkout (not part of the wheel): :mod:`experiments.toy`."""
