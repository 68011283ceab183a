"""Partition selection (Basic, the DPSU baselines, MAD, MAD2R, DP-SIPS, MAD-SIPS, the sequential policies).

Files by algorithm: ``<algo>_kernels.py`` is the pure math (scalar oracle and vectorised table forms
side by side; no Beam), ``<algo>.py`` its Beam stages (``basic.py``, ``mad.py``, ``mad_sips.py``,
``policy.py``; ``counts.py`` the released counts), ``reference.py`` everything in memory. The shared
sharding/capping engine is :mod:`transforms.core.engine`. The public entry point is ``select.py``'s
:class:`transforms.SelectPartitions`; the runners it dispatches to are private (docs/design.md).
"""
