"""Support for tests and benchmarks: synthetic data, the empirical privacy audit harness, fault
injection. NOT public API (no stability promise); importable by multi-process workers."""
