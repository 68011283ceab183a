"""Partition selection (Basic, the DPSU baselines, MAD, MAD2R, DP-SIPS, MAD-SIPS, the sequential policies).

Per algorithm: pure kernels (``*_kernels.py``; ``columnar_kernels.py`` the vectorised forms), one Beam
path (``columnar.py`` and ``columnar_mad_sips.py`` for the parallel algorithms, ``policy.py`` for the
sequential policies, ``counts.py`` for the released counts, the entry point ``select.py``) and the
in-memory reference (``reference.py``). The public entry point is :class:`transforms.SelectPartitions`.
"""
