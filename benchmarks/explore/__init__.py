"""One-off explorations (``python -m benchmarks.explore.NAME`` from the repository root): their findings are
kept in the docs that link to them."""
