"""How hard a pipeline's graph is for Flink's batch plan optimizer, and a warning before a run that may not start.

Beam's Flink runner translates a batch pipeline into a Flink DataSet plan, which Flink compiles before the
job starts. One pass of that compiler (``UnionParallelismAndForwardEnforcer`` in Flink 1.19's
``Optimizer.compile``) walks the plan from every sink through every input and broadcast (side) input
*without remembering visited operators*: its cost is the number of sink-to-source paths, which doubles with
every diamond (a PCollection read by two steps whose outputs meet again). DPNE's graph multiplies it per
level: ~75 s of compiling for 5.8 x 10^8 paths on the 2-core machine, a job that never starts at 10^12
(docs/engines.md, "Flink's plan optimizer"). Spark and Dataflow have no such pass.

:func:`plan_paths` counts the paths on the leaf-transform graph (main and side inputs: an upper bound of
Flink's, whose fusion merges chains, not diamonds); :func:`warn_if_flink_may_not_start` prints a warning
for a run submitted to a runner that may be Flink (``FlinkRunner``, or ``PortableRunner`` whose job server
may be Flink's). Nothing here changes or stops a run.
"""

from __future__ import annotations

import graphlib
import sys

from apache_beam.options.pipeline_options import StandardOptions

__all__ = ["leaf_graph", "unmemoised_visits", "plan_paths", "warn_if_flink_may_not_start", "WARN_PATHS", "NEVER_PATHS"]

#: warn from this many paths (~13 s of Flink's compiling at the measured ~1.3e-7 s a path)
WARN_PATHS = 10**8
#: seconds of Flink 1.19's compiling per path, measured on the 2-core machine (75 s for 5.8e8 paths of MAD-SIPS
#: inside DPNE; DPNE's default at --max_n 9, 5.8e8 paths too, compiled in ~34 s: an upper estimate)
SECONDS_PER_PATH = 1.3e-7
#: from this many paths (~22 min) the warning says the job may never start (2.9e12 did not in 950 s)
NEVER_PATHS = 10**10
_FLINK_RUNNERS = ("FlinkRunner", "PortableRunner")


def leaf_graph(proto) -> dict:
    """Pipeline proto -> {leaf transform id: ids of the leaf transforms producing its inputs (main and side)}."""
    leaves = {k: t for k, t in proto.components.transforms.items() if not t.subtransforms}
    producer = {pc: k for k, t in leaves.items() for pc in t.outputs.values()}
    return {k: {producer[pc] for pc in t.inputs.values() if producer.get(pc, k) != k} for k, t in leaves.items()}


def unmemoised_visits(inputs: dict) -> int:
    """Nodes a depth-first walk from every sink visits when it never remembers a visited node."""
    visits, consumed = {}, set()
    for node in graphlib.TopologicalSorter(inputs).static_order():
        visits[node] = 1 + sum(visits[i] for i in inputs[node])
        consumed.update(inputs[node])
    return sum(v for node, v in visits.items() if node not in consumed)


def plan_paths(pipeline) -> int:
    """The sink-to-source paths of ``pipeline``'s leaf-transform graph (the visits of Flink's walk, bounded)."""
    return unmemoised_visits(leaf_graph(pipeline.to_runner_api()))


def _runner_name(pipeline) -> str:
    runner = pipeline.options.view_as(StandardOptions).runner
    return runner if isinstance(runner, str) else type(pipeline.runner).__name__


def warn_if_flink_may_not_start(pipeline, file=sys.stderr) -> int:
    """On a Flink-capable runner, count the plan's paths and warn from :data:`WARN_PATHS`; returns the count
    (0 when not counted: other runners pay nothing, and a graph that cannot be counted is left to the runner,
    whose own conversion reports the problem: the check never fails a run)."""
    name = _runner_name(pipeline)
    if not any(name.endswith(r) for r in _FLINK_RUNNERS):
        return 0
    try:
        paths = plan_paths(pipeline)
    except Exception:  # noqa: BLE001 - advisory only; the CLI's run (inside its cleanup) meets the same error
        return 0
    if paths >= WARN_PATHS:
        minutes = paths * SECONDS_PER_PATH / 60.0
        never = "; the job may never start" if paths >= NEVER_PATHS else ""
        print(
            f"warning: this pipeline's plan has {paths:.2g} sink-to-source paths; on Flink, whose batch optimizer "
            f"walks each of them before the job starts, expect up to ~{minutes:,.0f} min of compiling (measured "
            f"on 2 cores{never}), and run the job server with -Xss16m (a deep plan overflows the default "
            "thread stack when it is deserialised). Spark and Dataflow are not affected. For DPNE: a smaller "
            '--max_n, or --selection single (docs/engines.md, "Flink\'s plan optimizer")',
            file=file,
        )
    return paths
