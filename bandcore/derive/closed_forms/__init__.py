r"""The closed-form Band of a generator and its report.

* :mod:`.reduction` — :math:`g_f` symbolically, per side of :math:`u = 1`;
* :mod:`.roots` — closed-form candidate roots by calls that cannot run away;
* :mod:`.validate` — candidates checked against bracketed roots;
* :mod:`.cells`, :mod:`.powers` — piecewise closed forms, pure powers of :math:`|u - 1|`;
* :mod:`.saturation`, :mod:`.limits` — thresholds, limits at :math:`p \to 0, 1`, the small-δ series;
* :mod:`.derivation` — :func:`~.derivation.derive` and :class:`~.derivation.Derivation`;
* :mod:`.report`, :mod:`.files` — Markdown/text reports and the packaged report files.
"""
