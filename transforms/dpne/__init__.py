"""DPNE: differentially private n-gram extraction (pure kernels, Beam transform, in-memory reference).
The public entry point is :class:`transforms.DPNE`."""
