"""Check that a release is complete and unchanged: ``python -m dp_partition_beam.pipelines.verify REPORT``.

A run writes its report last, listing every shard of its release with its size and sha256
(:func:`pipelines.outputs.write_report`). This command reads the report and checks each listed shard
(present, same bytes, same digest) and that no other file matches the release's shard pattern. Exit 0
and one summary line when all holds; exit 1 and one line per problem otherwise; exit 3 when the report
cannot be read (missing, or not a report of a complete run).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from typing import List, Optional

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems


def _digest(path: str):
    digest, size = hashlib.sha256(), 0
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def problems(report: dict) -> List[str]:
    """What is wrong with the release a report describes ([] when it is complete and unchanged)."""
    block = report.get("outputs")
    if not isinstance(block, dict) or not block.get("complete"):
        return ["the report has no 'outputs' block of a complete run"]
    found = []
    listed = {s["path"] for s in block["shards"]}
    for shard in block["shards"]:
        path = shard["path"]
        if not FileSystems.exists(path):
            found.append(f"{path}: missing")
            continue
        size, digest = _digest(path)
        if size != shard["bytes"] or digest != shard["sha256"]:
            found.append(f"{path}: changed since the run ({size} bytes, sha256 {digest[:12]}...)")
    matched = {m.path for r in FileSystems.match([block["release"]]) for m in r.metadata_list}
    for path in sorted(matched - listed):
        found.append(f"{path}: matches {block['release']} but is not a shard of this run")
    if len(listed) != block["num_shards"]:
        found.append(f"the report lists {len(listed)} shards, not num_shards = {block['num_shards']}")
    return found


def run(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="dp-verify-release", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("report", help="the JSON report of a run (--report)")
    args = parser.parse_args(argv)
    try:
        with FileSystems.open(args.report, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            report = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError) as e:
        print(f"error: cannot read the report {args.report}: {e}", file=sys.stderr)
        return 3
    found = problems(report)
    for line in found:
        print(f"error: {line}", file=sys.stderr)
    if found:
        return 1
    block = report["outputs"]
    total = sum(s["bytes"] for s in block["shards"])
    print(f"complete: {block['num_shards']} shard(s) of {block['release']}, {total} bytes, as the report lists")
    return 0


def main():
    sys.exit(run())


if __name__ == "__main__":
    # `python -m` runs this file as __main__: run the package module's main instead, so that the functions
    # the pipeline pickles belong to dp_partition_beam.pipelines.verify (an SDK worker in another process
    # cannot import __main__; Beam 2.62's dill sent them by value without their globals, and extract_ngrams'
    # build_report failed with "NameError: name 'json' is not defined" on the standalone Flink cluster).
    from dp_partition_beam.pipelines.verify import main as package_main

    package_main()
