"""Benchmarks of the package: the product scripts (run_all, bench_table2, ...) run as ``python -m benchmarks.NAME``
from the repository root; one-off explorations under benchmarks/explore/."""
