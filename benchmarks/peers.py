"""PipelineDP's ``select_partitions`` on Beam, the peer benchmarks/run_all.py measures us against.

Needs the ``bench`` extra (``pip install -e '.[bench]'``: pipeline-dp, python-dp). PipelineDP runs on
the same Beam DirectRunner as our transforms (``pipeline_dp.BeamBackend``) with the same
``(epsilon, delta)`` and the same per-user cap (its ``max_partitions_contributed`` = our Delta_0).

Strategies (``pipeline_dp.PartitionSelectionStrategy``):
  truncated_geometric  the optimal l0-bounded mechanism of Desfontaines et al.; counts users
  laplace_thresholding count + Laplace noise, threshold (l0 sensitivity Delta_0)
  gaussian_thresholding count + Gaussian noise, threshold (l2 sensitivity sqrt(Delta_0))
  weighted_gaussian    PipelineDP's weighted Gaussian (each user adds 1/sqrt(d), like our 'basic').
                       pipeline-dp 0.3.1 re-calibrates it (a scipy root search) for every
                       partition inside its filter, about 10 ms per item, so run_all.py runs it
                       only on small data (utility) and not in the speed runs.

PipelineDP draws its noise from OS entropy (no seed): utility is averaged over runs.
"""

from __future__ import annotations

import apache_beam as beam

PEER_STRATEGIES = {
    "pdp_truncated_geometric": "TRUNCATED_GEOMETRIC",
    "pdp_laplace": "LAPLACE_THRESHOLDING",
    "pdp_gaussian": "GAUSSIAN_THRESHOLDING",
    "pdp_weighted_gaussian": "WEIGHTED_GAUSSIAN_THRESHOLDING",
}


def _privacy_id(pair):
    return pair[0]


def _partition(pair):
    return pair[1]


def _engine_and_params(name, epsilon, delta, max_contributions, backend):
    import pipeline_dp  # the bench extra; imported lazily so the rest of the benchmarks run without it

    if name not in PEER_STRATEGIES:
        raise ValueError(f"peer must be one of {', '.join(map(repr, PEER_STRATEGIES))}, got {name!r}")
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=float(epsilon), total_delta=float(delta))
    engine = pipeline_dp.DPEngine(accountant, backend(pipeline_dp))
    params = pipeline_dp.SelectPartitionsParams(
        max_partitions_contributed=int(max_contributions),
        partition_selection_strategy=getattr(pipeline_dp.PartitionSelectionStrategy, PEER_STRATEGIES[name]),
    )
    extractors = pipeline_dp.DataExtractors(privacy_id_extractor=_privacy_id, partition_extractor=_partition)
    return accountant, engine, params, extractors


def select_local(pairs, name: str, epsilon: float, delta: float, max_contributions: int) -> set:
    """Released items of PipelineDP's ``select_partitions`` on its in-process ``LocalBackend``.

    The same DPEngine code path as on Beam (used for utility over many seeds; speed is measured on
    Beam with :class:`PipelineDPSelect`).
    """
    accountant, engine, params, extractors = _engine_and_params(
        name, epsilon, delta, max_contributions, lambda pdp: pdp.LocalBackend()
    )
    items = engine.select_partitions(pairs, params, extractors)
    accountant.compute_budgets()
    return set(items)


class PipelineDPSelect(beam.PTransform):
    """(user, item) -> item: PipelineDP ``DPEngine.select_partitions`` with one strategy.

    The budget accountant is finalised (``compute_budgets``) in ``expand``, once per pipeline,
    before the pipeline runs, as PipelineDP requires.
    """

    def __init__(self, name: str, epsilon: float, delta: float, max_contributions: int, label=None):
        super().__init__(label)
        if name not in PEER_STRATEGIES:
            raise ValueError(f"peer must be one of {', '.join(map(repr, PEER_STRATEGIES))}, got {name!r}")
        self._name, self._epsilon, self._delta, self._k = name, float(epsilon), float(delta), int(max_contributions)

    def expand(self, pairs):
        accountant, engine, params, extractors = _engine_and_params(
            self._name, self._epsilon, self._delta, self._k, lambda pdp: pdp.BeamBackend()
        )
        items = engine.select_partitions(pairs, params, extractors)  # item
        accountant.compute_budgets()
        return items
