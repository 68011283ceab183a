"""The CLIs make Arrow use the system allocator unless the user chose one (pipelines/__init__.py).

pyarrow's default pool (mimalloc in its wheels) kept ~100-140 MB more resident memory at the peak of a
4M-pair run (docs/columnar.md, "Memory"). Arrow reads ARROW_DEFAULT_MEMORY_POOL when pyarrow is first
imported, so the check runs in fresh interpreters."""

import os
import subprocess
import sys

PROBE = (
    "import dp_partition_beam.pipelines.select_partitions, pyarrow as pa; print(pa.default_memory_pool().backend_name)"
)


def backend(env_value):
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if env_value is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_the_clis_default_to_the_system_allocator():
    assert backend(None) == "system"


def test_a_users_choice_of_allocator_is_kept():
    import pyarrow as pa

    others = [b for b in pa.supported_memory_backends() if b != "system"]  # mimalloc, jemalloc: per build
    assert others, "this pyarrow build has only the system allocator: nothing to choose"
    for chosen in others:
        assert backend(chosen) == chosen
