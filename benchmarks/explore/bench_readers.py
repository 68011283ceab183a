"""Records/s of the input readers: ReadRecords (one element per record) vs ReadRecordBatches.

    .venv/bin/python -m benchmarks.explore.bench_readers                     # 4M records, tsv + jsonl + bundled
    .venv/bin/python -m benchmarks.explore.bench_readers --records 200000 --repeats 1

Inputs: a generated tsv and jsonl of ``--records`` records (users ``u<hex>``, ~10 records per user,
items Zipf-like words of 1-12 letters) and the bundled ``data/debian_words.tsv.gz`` (gzip: one work
item). Each pipeline reads and counts the records on the DirectRunner (in_memory):
  ReadRecords        the per-line reader, Count.Globally over its (user, value) elements;
  ReadRecordBatches  the batched reader, summing the batches' num_rows;
  batches->pairs     the batched reader followed by FlatMap(batch_records) and Count.Globally
                     (what the CLIs do until the algorithms take batches).
Prints a table of the median wall time of ``--repeats`` runs and records/s; every reader must count
the same records (checked).
"""

import argparse
import json
import os
import statistics
import tempfile
import time

import apache_beam as beam
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions

from dp_partition_beam.pipelines.io import ReadRecordBatches, ReadRecords, batch_records

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BUNDLED = os.path.join(REPO, "data", "debian_words.tsv.gz")


def generate(n: int, directory: str, seed: int = 0):
    """Writes in.tsv and in.jsonl with the same n records; returns their paths."""
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    vocabulary = ["".join(map(chr, rng.choice(letters, size=rng.integers(1, 13)))) for _ in range(50_000)]
    ranks = np.minimum(rng.zipf(1.3, size=n), len(vocabulary)) - 1
    users = rng.integers(0, max(n // 10, 1), size=n)
    tsv, jsonl = os.path.join(directory, "in.tsv"), os.path.join(directory, "in.jsonl")
    with open(tsv, "w", encoding="utf-8") as ft, open(jsonl, "w", encoding="utf-8") as fj:
        for a in range(0, n, 100_000):
            part = range(a, min(a + 100_000, n))
            ft.write("".join(f"u{users[j]:x}\t{vocabulary[ranks[j]]}\n" for j in part))
            fj.write("".join(f'{{"user": "u{users[j]:x}", "item": "{vocabulary[ranks[j]]}"}}\n' for j in part))
    return tsv, jsonl


def _write_count(count, path):
    with open(path, "w") as f:
        f.write(str(count))


def _num_rows(batch):
    return batch.num_rows


def run(reader: str, path: str, fmt: str) -> tuple:
    """(wall seconds, records counted) of one pipeline."""
    options = PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=in_memory"])
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "count")
        t0 = time.perf_counter()
        with beam.Pipeline(options=options) as p:
            if reader == "ReadRecords":
                counts = (p | ReadRecords(path, fmt)).records | beam.combiners.Count.Globally()  # n
            elif reader == "ReadRecordBatches":
                batches = (p | ReadRecordBatches(path, fmt)).records  # pa.RecordBatch
                counts = batches | beam.Map(_num_rows) | beam.CombineGlobally(sum)  # n
            else:
                pairs = (p | ReadRecordBatches(path, fmt)).records | beam.FlatMap(batch_records)  # (user, item)
                counts = pairs | beam.combiners.Count.Globally()  # n
            _ = counts | beam.Map(_write_count, out)
        seconds = time.perf_counter() - t0
        with open(out) as f:
            return seconds, int(f.read())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=4_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the rows as JSON to this file")
    args = parser.parse_args(argv)
    readers = ["ReadRecords", "ReadRecordBatches", "batches->pairs"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tsv, jsonl = generate(args.records, tmp)
        inputs = [
            (f"generated tsv ({os.path.getsize(tsv) / 1e6:.0f} MB)", tsv, "tsv"),
            (f"generated jsonl ({os.path.getsize(jsonl) / 1e6:.0f} MB)", jsonl, "jsonl"),
            ("data/debian_words.tsv.gz", BUNDLED, "tsv"),
        ]
        for name, path, fmt in inputs:
            counted = set()
            base = None
            for reader in readers:
                times = []
                for _ in range(args.repeats):
                    seconds, n = run(reader, path, fmt)
                    times.append(seconds)
                    counted.add(n)
                median = statistics.median(times)
                base = base or median
                rows.append(
                    {
                        "input": name,
                        "reader": reader,
                        "records": n,
                        "median_s": round(median, 2),
                        "records_per_s": round(n / median),
                        "speedup": round(base / median, 1),
                    }
                )
                print(rows[-1], flush=True)
            if len(counted) != 1:
                raise SystemExit(f"{name}: the readers counted different numbers of records: {sorted(counted)}")
    load = os.getloadavg()[0]
    print(f"\nDirectRunner in_memory, median of {args.repeats}, load average {load:.1f}, {os.cpu_count()} cores")
    print(f"{'input':32} {'reader':18} {'records':>9} {'median s':>9} {'records/s':>11} {'speedup':>8}")
    for r in rows:
        print(
            f"{r['input']:32} {r['reader']:18} {r['records']:>9} {r['median_s']:>9.2f} "
            f"{r['records_per_s']:>11,} {r['speedup']:>7.1f}x"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
