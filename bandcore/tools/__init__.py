"""Tools built on the library: figures (plot), the benchmark against the published solver (bench) and that
solver's re-implementation (published).  They sit above :mod:`bandcore.verify` in the layering and import
anything below; nothing in the library imports them.
"""
