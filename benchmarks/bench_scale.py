"""Wall time and peak RSS of one SelectPartitions run on N synthetic Zipf pairs (DirectRunner in_memory).

    .venv/bin/python -m benchmarks.bench_scale 1e8 basic     # 100M pairs, Arrow tables per 100k-pair chunk

Prints ``[size, algorithm] wall released peak``; run it under ``/usr/bin/time -v`` for the OS's view.
Used for the 100M-pair point of issue 16 (docs/columnar.md, "Packed tables").
"""

import logging
import sys

from benchmarks import bench_select
from benchmarks.run_all import own_peak_rss_kb
from dp_partition_beam.privacy import SelectionParams
from dp_partition_beam.transforms.selection.select import SelectPartitions

logging.getLogger("dp_partition_beam.transforms.core.randomness").setLevel(logging.ERROR)


def main(argv):
    size, algorithm = float(argv[0]), (argv[1] if len(argv) > 1 else "basic")
    n_chunks = int(round(size / (bench_select.USERS_PER_CHUNK * 10)))
    select = SelectPartitions(algorithm, SelectionParams(epsilon=1.0, delta=1e-5, max_contributions=100), seed=1)
    wall, items = bench_select.run_beam_transform(select, n_chunks, "in_memory", batched=True)
    print([argv[0], algorithm], f"{wall:.1f}s", len(items), f"peak {own_peak_rss_kb() / 1024:.0f} MB")


if __name__ == "__main__":
    main(sys.argv[1:])
