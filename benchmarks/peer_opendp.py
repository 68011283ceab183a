"""OpenDP's Polars key release: the fast single-process peer of benchmarks/run_all.py (tool ``opendp_gaussian``).

    .venv/bin/python -m benchmarks.peer_opendp PATH.tsv --epsilon 1 --delta 1e-5 --max_contributions 100

The command releases the items of a headerless ``user<TAB>item`` TSV (``.gz`` too) and prints the wall
time, the calibration, the number of released items and the peak RSS, to be timed next to our CLI
``dp-select-partitions`` on the same file; ``--output`` writes the released items, one per line.

Needs the ``bench`` extra (``pip install -e '.[bench]'``: ``opendp[polars]``). Where PipelineDP
(benchmarks/peers.py) is the peer on our runner, this one is a different engine: one process, Polars'
multi-threaded columnar execution, no Beam. run_all.py runs it on the same input as ours and
PipelineDP (the same Zipf rows, the same utility datasets) at the same epsilon, delta and Delta_0.

What :func:`release` computes, with OpenDP's Context API (``dp.Context.compositor``) on a Polars
LazyFrame of (user, item) rows:

1. privacy unit ``dp.unit_of(contributions=1, identifier=pl.col("user"))``: neighbouring datasets
   differ by all the rows of one user;
2. inside the query, ``truncate_per_group(1, keep="first")`` keeps one row per (user, item) (the
   duplicates are equal rows; the default ``keep="sample"`` shuffles them, ~2 s more per 1M rows) and
   ``truncate_num_groups(Delta_0 + 1, keep="first")`` keeps each user's Delta_0 items of lowest
   (priority, item), where priority is a salted hash of the item (one pseudo-random order of the
   items, the same for every user, added row-wise before the query). That is what OpenDP's
   ``keep="sample"`` does (it ranks by the key's hash), but ``keep="sample"`` fails when the query runs
   on opendp 0.16.0 ("multiple fields with name 'item' found"); ``keep="first"`` alone would keep
   the lexicographically smallest items. Which items a user keeps depends on that user's rows only.
   Delta_0 + 1: on opendp 0.16.0 ``truncate_num_groups(k)`` keeps k - 1 groups per user (it filters
   on a dense rank, which starts at 1, being < k) and accounts for k, so asking for Delta_0 + 1
   keeps Delta_0 items, and OpenDP calibrates the noise for Delta_0 + 1 (its bound; the peer pays
   sqrt((Delta_0 + 1) / Delta_0) more noise than needed: +0.5% at Delta_0 = 100, +41% at 1);
3. ``group_by(priority, item).agg(dp.len(signed=False))``: each count gets integer Gaussian noise of scale
   sigma and only the items whose noisy count exceeds the threshold T are released. With L = Delta_0 + 1
   groups per user in OpenDP's bound, each changed by at most 1 (L2 sensitivity sqrt(L)), OpenDP's
   privacy map gives approximate zCDP (rho, delta_t): rho = L / (2 sigma^2), and delta_t =
   1 - (1 - P[noise > T - 1])^L for the items only one user holds.
   OpenDP searches sigma and T for the budget ``dp.loss_of(rho=rho, delta=delta_t)``;
4. the whole release (keys and noisy counts; only the keys are used) is (epsilon, delta)-DP:
   OpenDP's zCDP to approximate-DP conversion (``make_zCDP_to_approxDP``, ``make_fix_delta(delta)``)
   of the resolved measurement is checked on every run to give at most epsilon with the delta that
   is left after delta_t (:class:`Release` holds the certified pair; a larger epsilon raises
   RuntimeError before anything is released).

The split of delta between the threshold (delta_t) and the conversion (delta - delta_t) is chosen on
the grid delta_t = delta * (1/20, ..., 19/20) to minimise the threshold (:func:`calibrate`): for each
split, rho is the largest value that OpenDP's conversion turns into (epsilon, delta - delta_t)-DP,
and the threshold is estimated as 1 + sigma * z, z the standard normal quantile of the per-item tail
(the continuous Gaussian in place of OpenDP's integer one; OpenDP then computes the real T).

Noise comes from OpenDP's CSPRNG (seeded by the OS) and cannot be seeded: the released set varies
between runs. OpenDP's parameter search (``query.resolve()``, a few seconds whatever the data size)
runs on every release and is part of the measured time.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import logging
import math
import os
import resource
import sys
import time
from dataclasses import dataclass
from statistics import NormalDist

OPENDP_TOOL = "opendp_gaussian"
OPENDP_MODE = "polars"  # run_all's mode column for this peer: one process, Polars' own thread pool
DELTA_SPLITS = tuple(i / 20 for i in range(1, 20))  # shares of delta for the threshold (delta_t / delta)
# truncate_num_groups(k) keeps k - 1 groups on opendp 0.16.0 (module docstring): ask for Delta_0 + this
GROUPS_SLACK = 1
PRIORITY_SEED = 0x5EED  # salt of the item hash that orders each user's items for truncation
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STARTED = time.perf_counter()  # the command's start, before Polars and OpenDP are imported


def _opendp():
    """``opendp.prelude`` with the contrib features on (the Polars API needs them); imported lazily so
    run_all.py imports this module without the bench extra."""
    import opendp.prelude as dp

    dp.enable_features("contrib")
    logging.getLogger("opendp.context").setLevel(logging.ERROR)  # "delta should be <= 1e-6": ours is on purpose
    return dp


@dataclass(frozen=True)
class Calibration:
    """The budget split of one (epsilon, delta, Delta_0): zCDP rho and the deltas of threshold and conversion."""

    epsilon: float
    delta: float
    max_contributions: int
    groups: int  # OpenDP's bound on the items of one user: Delta_0 + GROUPS_SLACK
    rho: float
    delta_threshold: float
    delta_conversion: float
    approx_threshold: float  # 1 + sigma * z with the continuous Gaussian (OpenDP computes the real one)


@dataclass(frozen=True)
class Release:
    """Released items of one run, with what OpenDP resolved and certified."""

    items: frozenset
    calibration: Calibration
    scale: float  # sigma of the integer Gaussian noise on each count
    threshold: int  # items with noisy count > threshold are released
    certified_epsilon: float  # OpenDP's conversion of the resolved measurement at delta ...
    certified_delta: float  # ... = delta (threshold's part + conversion's part)
    resolve_s: float  # OpenDP's parameter search (query.resolve())
    run_s: float  # the query itself (reading the data included when it is a scan)


def _rho_for(epsilon: float, delta_conversion: float) -> float:
    """The largest rho (to a relative 1e-6, rounded down) whose rho-zCDP OpenDP converts to
    (epsilon, delta_conversion)-DP.

    The rho-zCDP guarantee is that of a Gaussian mechanism of sensitivity 1 and scale 1/sqrt(2 rho),
    whose privacy profile OpenDP's ``make_zCDP_to_approxDP`` gives. Bisection in log(rho), ~25 steps
    (``dp.binary_search`` would go to full float precision).
    """
    dp = _opendp()
    space = dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float)

    def converts(rho):
        gauss = dp.m.make_gaussian(*space, scale=1.0 / math.sqrt(2.0 * rho))
        return dp.c.make_zCDP_to_approxDP(gauss).map(1.0).delta(epsilon) <= delta_conversion

    lo, hi = 1e-12, 2.0 * epsilon + 1.0  # rho < epsilon for any delta < 1: hi never converts
    if not converts(lo) or converts(hi):
        raise ValueError(f"no rho in [{lo}, {hi}] converts to ({epsilon}, {delta_conversion})-DP")
    while hi > lo * (1 + 1e-6):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if converts(mid) else (lo, mid)
    return lo


@functools.lru_cache(maxsize=None)
def calibrate(epsilon: float, delta: float, max_contributions: int) -> Calibration:
    """The split of delta (grid :data:`DELTA_SPLITS`) that minimises the threshold; see the module docstring."""
    if not (epsilon > 0 and 0 < delta < 1 and max_contributions >= 1):
        raise ValueError(
            f"need epsilon > 0, 0 < delta < 1, max_contributions >= 1; got {epsilon}, {delta}, {max_contributions}"
        )
    groups = max_contributions + GROUPS_SLACK
    best = None
    for share in DELTA_SPLITS:
        delta_t = delta * share
        rho = _rho_for(epsilon, delta - delta_t)
        sigma = math.sqrt(groups / (2.0 * rho))
        per_item = -math.expm1(math.log1p(-delta_t) / groups)  # 1 - (1 - p)^groups = delta_t
        threshold = 1.0 + sigma * -NormalDist().inv_cdf(per_item)
        if best is None or threshold < best.approx_threshold:
            best = Calibration(epsilon, delta, max_contributions, groups, rho, delta_t, delta - delta_t, threshold)
    return best


def _lazy(rows):
    """(user, item) rows as a LazyFrame of two String columns: a polars LazyFrame or DataFrame, an Arrow
    table, or a sequence of (user, item) pairs."""
    import polars as pl

    if isinstance(rows, pl.LazyFrame):
        lf = rows
    elif isinstance(rows, pl.DataFrame):
        lf = rows.lazy()
    elif hasattr(rows, "schema") and hasattr(rows, "column_names"):  # pyarrow Table
        lf = pl.from_arrow(rows).lazy()
    else:
        lf = pl.DataFrame(list(rows), schema={"user": pl.String, "item": pl.String}, orient="row").lazy()
    return lf.select(pl.col("user").cast(pl.String), pl.col("item").cast(pl.String))


def scan_tsv(path: str):
    """A headerless user<TAB>item file (``.gz`` read whole, anything else scanned lazily) as a LazyFrame."""
    import polars as pl

    options = dict(
        separator="\t",
        has_header=False,
        quote_char=None,
        schema={"user": pl.String, "item": pl.String},
    )
    if path.endswith(".gz"):
        return pl.read_csv(path, **options).lazy()
    return pl.scan_csv(path, **options)


def release(rows, epsilon: float, delta: float, max_contributions: int) -> Release:
    """(epsilon, delta)-DP release of the items of ``rows`` (see the module docstring), the user as privacy unit."""
    import polars as pl
    from opendp.accuracy import summarize_polars_measurement

    dp = _opendp()
    cal = calibrate(float(epsilon), float(delta), int(max_contributions))
    lf = _lazy(rows).with_columns(pl.col("item").hash(seed=PRIORITY_SEED).alias("priority"))
    by = [pl.col("priority"), pl.col("item")]
    context = dp.Context.compositor(
        data=lf,
        privacy_unit=dp.unit_of(contributions=1, identifier=pl.col("user")),
        privacy_loss=dp.loss_of(rho=cal.rho, delta=cal.delta_threshold),
        split_evenly_over=1,
    )
    query = (
        context.query()
        .truncate_per_group(1, by=by, keep="first")  # one row per (user, item): the rows are equal
        .truncate_num_groups(cal.groups, by=by, keep="first")  # Delta_0 items per user (GROUPS_SLACK)
        .group_by(by)
        .agg(dp.len(signed=False))
    )
    t0 = time.perf_counter()
    measurement = query.resolve()  # OpenDP searches the noise scale and the threshold for (rho, delta_t)
    resolve_s = time.perf_counter() - t0
    whole = dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(measurement), delta=cal.delta)
    certified_epsilon, certified_delta = whole.map(context.d_in)
    if certified_epsilon > cal.epsilon or certified_delta > cal.delta:
        raise RuntimeError(f"OpenDP certifies ({certified_epsilon}, {certified_delta}), not ({epsilon}, {delta})")
    summary = summarize_polars_measurement(measurement).row(0, named=True)
    t0 = time.perf_counter()
    released = context(measurement).collect()  # the compositor checks the budget and runs the query
    run_s = time.perf_counter() - t0
    return Release(
        items=frozenset(released.get_column("item").to_list()),
        calibration=cal,
        scale=float(summary["scale"]),
        threshold=int(summary["threshold"]),
        certified_epsilon=float(certified_epsilon),
        certified_delta=float(certified_delta),
        resolve_s=resolve_s,
        run_s=run_s,
    )


def release_keys(rows, epsilon: float, delta: float, max_contributions: int) -> set:
    """The released items of :func:`release` (rows: LazyFrame, DataFrame, Arrow table or (user, item) pairs)."""
    return set(release(rows, epsilon, delta, max_contributions).items)


def release_keys_tsv(path: str, epsilon: float, delta: float, max_contributions: int) -> set:
    """The released items of :func:`release` on a headerless user<TAB>item TSV."""
    return release_keys(scan_tsv(path), epsilon, delta, max_contributions)


# ------------------------------------------------------------------------------- measurements
def own_peak_rss_kb():
    """This process's own peak resident set size in KiB (VmHWM; ru_maxrss where /proc is absent).

    Linux carries ru_maxrss across fork/exec, so in a subprocess RUSAGE_SELF would report the
    launching process's peak; VmHWM is this process's own.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def zipf_table_of_chunk_loader():
    """``zipf_table_of_chunk`` of transforms/testing/synthetic.py, loaded from its file on its own.

    Importing it as ``dp_partition_beam.transforms.testing.synthetic`` runs the package's
    ``__init__``, which imports Beam (~120 MB of RSS this peer does not use); the file itself needs
    only numpy and pyarrow. Same function, same rows (tests/benchmarks/test_peer_opendp.py).
    """
    path = os.path.join(REPO, "transforms", "testing", "synthetic.py")
    spec = importlib.util.spec_from_file_location("_peer_opendp_synthetic", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.zipf_table_of_chunk


def zipf_run(spec: dict) -> dict:
    """One speed measurement of run_all.py in this (fresh) process: the same Zipf rows as ours and
    PipelineDP get (``zipf_table_of_chunk`` of chunks 0..n_chunks-1), released with :func:`release`.

    Timed: generating the chunks' Arrow tables, handing them to Polars, OpenDP's parameter search
    and the query (what the Beam tools' wall time covers too: generating their input in the pipeline
    and selecting; they also write the released items to a file). Not timed: start-up and imports.
    Returns the dict of run_all's ``_one_run`` (wall_s, cpu_s, released, peak_rss_mb, digest).
    """
    import hashlib

    import pyarrow as pa

    _opendp()  # imports outside the timed part, like the Beam tools' imports
    table_of_chunk = zipf_table_of_chunk_loader()
    t0 = time.perf_counter()
    table = pa.concat_tables([table_of_chunk(c, spec["users_per_chunk"]) for c in range(spec["n_chunks"])])
    result = release(table, spec["epsilon"], spec["delta"], spec["max_contributions"])
    elapsed = time.perf_counter() - t0
    me = resource.getrusage(resource.RUSAGE_SELF)
    digest = hashlib.sha256("\n".join(sorted(result.items)).encode()).hexdigest()
    return dict(
        wall_s=elapsed,
        cpu_s=me.ru_utime + me.ru_stime,  # whole process, imports included, all of Polars' threads
        released=len(result.items),
        peak_rss_mb=own_peak_rss_kb() / 1024.0,
        digest=digest,
        pairs=table.num_rows,
        threshold=result.threshold,
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tsv", nargs="?", help="headerless user<TAB>item file (.gz too)")
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--max_contributions", type=int, default=100, help="Delta_0: distinct items kept per user")
    ap.add_argument("--output", help="write the released items here, one per line")
    ap.add_argument("--zipf", help=argparse.SUPPRESS)  # run_all.py's speed run (JSON spec); prints JSON
    args = ap.parse_args(argv)
    if args.zipf:
        print(json.dumps(zipf_run(json.loads(args.zipf))))
        return 0
    if not args.tsv:
        ap.error("the TSV path is required")
    import polars as pl

    _opendp()
    t0 = time.perf_counter()
    result = release(scan_tsv(args.tsv), args.epsilon, args.delta, args.max_contributions)
    if args.output:
        with open(args.output, "w") as f:
            f.writelines(f"{item}\n" for item in sorted(result.items))
    wall, since_start = time.perf_counter() - t0, time.perf_counter() - _STARTED
    cal = result.calibration
    print(f"{OPENDP_TOOL} on {args.tsv}: epsilon {cal.epsilon:g}, delta {cal.delta:g}, Delta_0 {cal.max_contributions}")
    print(
        f"calibration: rho {cal.rho:.6g} (zCDP), delta {cal.delta_threshold:.3g} to the threshold + "
        f"{cal.delta_conversion:.3g} to the conversion; integer Gaussian scale {result.scale:.4g}, threshold "
        f"{result.threshold}; OpenDP certifies ({result.certified_epsilon:.6g}, {result.certified_delta:g})-DP"
    )
    print(
        f"wall {wall:.2f} s after imports, {since_start:.2f} s with them (OpenDP's parameter search "
        f"{result.resolve_s:.2f} s, read + query "
        f"{result.run_s:.2f} s; Polars threads {pl.thread_pool_size()}); released {len(result.items):,} items; "
        f"peak RSS {own_peak_rss_kb() / 1024.0:.0f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
