"""Partition selection (Basic, the DPSU baselines, MAD, MAD2R, DP-SIPS, the sequential policies).

Per algorithm: pure kernels (``*_kernels.py``), Beam transforms (``basic.py``, ``mad.py``, ``policy.py``,
the entry point ``select.py``) and the in-memory reference (``reference.py``). The public entry point
is :class:`transforms.SelectPartitions`.
"""
