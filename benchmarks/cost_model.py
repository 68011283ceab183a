"""The cost model of docs/scaling.md: workers, CPU, shuffle volume and wall time of partition selection
at 10^9 to 10^11 pairs, from per-pair costs measured on the standalone Flink cluster.

    python -m benchmarks.cost_model                          # the table of docs/scaling.md
    python -m benchmarks.cost_model --workers 250 --vcpus 8  # another cluster
    python -m benchmarks.cost_model --check 64e6             # the model on the 2-core machine, one size

Per algorithm, the measured constants (benchmarks/bench_engines.py on `.ci/engines.sh cluster up`, 2 cores,
2026-11-27, after the heavy-user pass and MAD-SIPS's hopeful-only side input; marginal costs are the slope
between 4M and 16M pairs):

    cpu_s_per_m      CPU seconds of the whole machine per million pairs (JVMs, SDK workers, client)
    shuffled_b       bytes through hash-partitioned exchanges per pair (Flink's read-bytes of those edges)
    shuffles         hash-partitioned exchanges in the job graph
    side_b_per_item  bytes of the largest side input broadcast to every worker, per distinct item of the
                     input (measured at 16M pairs: 689,281 distinct items; mad_sips's scaled by 0.64, its
                     hopeful-only list against the full one, measured on the DirectRunner)

The model (every assumption a flag):

    wall = fixed + shuffles x stage_s + N x cpu / (vCPUs x efficiency) + N x shuffled_b / (workers x shuffle_bps)

CPU and shuffle are summed, not overlapped (an upper bound); the work is assumed spread evenly (user and
item shards of bounded size, docs/columnar.md "Bounds"). Side inputs are held by every SDK process (on
Dataflow's Python workers one per vCPU by default); where their copies pass ``side_input_limit`` of a
worker's memory the row is flagged: the model does not hold there. The side input grows with the distinct
items (bytes per distinct item measured at 16M pairs), and those with the pairs at ``distinct_per_pair``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

__all__ = ["Measured", "MEASURED", "Cluster", "predict", "measured_machine"]


@dataclass(frozen=True)
class Measured:
    """Per-pair costs of one algorithm on the 2-core Flink cluster (bench_engines.py, 4M -> 16M slope)."""

    cpu_s_per_m: float
    shuffled_b: float
    shuffles: int
    side_b_per_item: float
    fixed_s: float  # wall seconds of the fit's intercept on the 2-core cluster (job start)


MEASURED = {
    "basic": Measured(cpu_s_per_m=3.25, shuffled_b=8.1, shuffles=6, side_b_per_item=0.0, fixed_s=24.9),
    "mad2r": Measured(cpu_s_per_m=5.42, shuffled_b=28.3, shuffles=13, side_b_per_item=34.3, fixed_s=34.9),
    "mad_sips": Measured(cpu_s_per_m=7.67, shuffled_b=45.3, shuffles=25, side_b_per_item=24.7, fixed_s=37.3),
}


@dataclass(frozen=True)
class Cluster:
    workers: int = 100
    vcpus: int = 8  # per worker (n2-standard-8 and alike)
    memory_gb: float = 32.0  # per worker
    efficiency: float = 0.5  # share of the vCPUs' time spent on useful work at scale (stragglers, barriers)
    shuffle_mbps: float = 100.0  # MB/s of shuffle per worker (disk or the Dataflow Shuffle service)
    stage_s: float = 20.0  # scheduling and barrier cost per shuffle stage
    fixed_s: float = 180.0  # job start: workers booted, code staged, graph translated
    side_input_limit: float = 0.5  # share of a worker's memory the side inputs' copies may take
    sdk_processes: int = 0  # Python SDK processes per worker, each with its own side inputs (0: one per vCPU)
    distinct_per_pair: float = 0.0275  # distinct items per pair: Common Crawl in the MAD paper (22e9 / 800e9)


def predict(m: Measured, c: Cluster, pairs: float) -> dict:
    """Workers' CPU hours, shuffle volume, wall time (hours) and whether the side inputs fit."""
    cpu_s = pairs / 1e6 * m.cpu_s_per_m
    compute_s = cpu_s / (c.workers * c.vcpus * c.efficiency)
    shuffle_bytes = pairs * m.shuffled_b
    shuffle_s = shuffle_bytes / (c.workers * c.shuffle_mbps * 1e6)
    wall_s = c.fixed_s + m.shuffles * c.stage_s + compute_s + shuffle_s
    side_gb = pairs * c.distinct_per_pair * m.side_b_per_item / 1e9
    copies = c.sdk_processes or c.vcpus  # Dataflow's Python default: one SDK process per vCPU
    return {
        "cpu_h": cpu_s / 3600,
        "shuffle_tb": shuffle_bytes / 1e12,
        "wall_h": wall_s / 3600,
        "vcpu_h_billed": wall_s / 3600 * c.workers * c.vcpus,
        "side_gb": side_gb,
        "fits": side_gb * copies <= c.side_input_limit * c.memory_gb,
    }


def measured_machine(m: Measured) -> Cluster:
    """The 2-core machine the constants were measured on, as a Cluster: 1 worker, 2 vCPUs, efficiency 1,
    the measured job start, no stage cost and no network (a local run's shuffle is a memory copy)."""
    return Cluster(workers=1, vcpus=2, efficiency=1.0, shuffle_mbps=float("inf"), stage_s=0.0, fixed_s=m.fixed_s)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Cluster()
    for name in Cluster.__dataclass_fields__:
        ap.add_argument(f"--{name}", type=type(getattr(defaults, name)), default=getattr(defaults, name))
    ap.add_argument("--pairs", nargs="+", type=float, default=[1e9, 1e10, 1e11, 8e11])
    ap.add_argument(
        "--check",
        type=float,
        default=None,
        help="pairs: predict one run on the 2-core machine the constants were measured on (measured_machine)",
    )
    args = ap.parse_args(argv)
    if args.check is not None:
        print("| algorithm | pairs | predicted wall s | predicted CPU s |")
        print("|---|---:|---:|---:|")
        for name, m in MEASURED.items():
            p = predict(m, measured_machine(m), args.check)
            print(f"| {name} | {args.check:,.0f} | {p['wall_h'] * 3600:.0f} | {p['cpu_h'] * 3600:.0f} |")
        return
    c = Cluster(**{name: getattr(args, name) for name in Cluster.__dataclass_fields__})
    print(
        f"{c.workers} workers x {c.vcpus} vCPUs, {c.memory_gb:g} GB each; efficiency {c.efficiency:g}; shuffle "
        f"{c.shuffle_mbps:g} MB/s per worker; {c.stage_s:g} s per shuffle stage; job start {c.fixed_s:g} s; "
        f"{c.distinct_per_pair:g} distinct items per pair"
    )
    print("| algorithm | pairs | CPU hours (work) | shuffled TB | wall hours | vCPU hours billed | side input GB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, m in MEASURED.items():
        for pairs in args.pairs:
            p = predict(m, c, pairs)
            side = f"{p['side_gb']:.1f}" + ("" if p["fits"] else " (does not fit)")
            print(
                f"| {name} | {pairs:.0e} | {p['cpu_h']:,.1f} | {p['shuffle_tb']:,.2f} | {p['wall_h']:.2f} "
                f"| {p['vcpu_h_billed']:,.0f} | {side} |"
            )


if __name__ == "__main__":
    main()
