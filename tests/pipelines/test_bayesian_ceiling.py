"""The offline ceiling of dp-bayesian-eval (issue 33): the best (S, rho) of a grid for the paper's Algorithm 1
(``bayesian_data_dependent``), chosen with the truth.

Every cell of the grid must be what the mechanism itself releases with that (S, rho) and seed (else the
ceiling would describe another mechanism), and the ceiling can only be at or below any grid point.
"""

import numpy as np
import pytest

from dp_partition_beam.pipelines import bayesian_eval
from dp_partition_beam.privacy.bayesian import BayesianParams
from dp_partition_beam.transforms.bayesian import bayesian_kernels as K
from dp_partition_beam.transforms.bayesian.reference import release_from_user_counts
from dp_partition_beam.transforms.testing.bayesian_synthetic import synthetic_corpus

DD = "bayesian_data_dependent"  # the ceiling is Algorithm 1's (the paper's mechanism)
SC = synthetic_corpus(V=300, users=2000, public_size=100_000, tau=0.8, noise=0.5, C=1, W=10, seed=4)


@pytest.mark.parametrize("sensitivity", ["brute_force", "bound"])
def test_each_grid_cell_is_the_mechanisms_own_release(sensitivity):
    base = BayesianParams(C=1, W=10, delta=1e-6, sensitivity=sensitivity)
    S_values, rho_values = (1e-3, 0.05, 1.0), (0.02, 0.5)
    kl = bayesian_eval.grid_kl(SC.users, SC.p_private, SC.prior, base, 2.0, S_values, rho_values, 2, 7)
    for a, S in enumerate(S_values):
        for b, rho in enumerate(rho_values):
            params = base.replace(epsilon=2.0, S=S, rho=rho, acknowledge_data_dependent=True)
            want = np.mean(
                [
                    K.kl_divergence(SC.p_private, release_from_user_counts(SC.users, DD, SC.prior, params, seed)[0])
                    for seed in (7, 8)
                ]
            )
            assert kl[a, b] == want, (S, rho)
    assert len(np.unique(kl)) == kl.size  # the cells differ: S and rho both reach the release


def test_ceiling_is_the_grid_minimum_per_epsilon_and_beats_the_data_dependent_choice():
    base = BayesianParams(C=1, W=10)
    rows = bayesian_eval.ceiling(SC.users, SC.p_private, SC.prior, base, [0.5, 8.0], 2, 0)
    assert [r["epsilon"] for r in rows] == [0.5, 8.0] and all(r["mechanism"] == "ceiling" for r in rows)
    for r in rows:
        kl = bayesian_eval.grid_kl(
            SC.users,
            SC.p_private,
            SC.prior,
            base,
            r["epsilon"],
            bayesian_eval.CEILING_S,
            bayesian_eval.CEILING_RHO,
            2,
            0,
        )
        assert r["kl_mean"] == kl.min()
        assert (r["S"], r["rho"]) in {(S, rho) for S in bayesian_eval.CEILING_S for rho in bayesian_eval.CEILING_RHO}
        default = bayesian_eval.evaluate(SC.users, SC.p_private, SC.prior, base, [r["epsilon"]], [DD], 2, 0)[-1][
            "kl_mean"
        ]
        assert r["kl_mean"] <= default
    # more budget, a better best choice (8 vs 0.5: the noise per unit sensitivity is ~14x smaller)
    assert rows[1]["kl_mean"] < rows[0]["kl_mean"]


def test_ceiling_S_values_scale_with_C():
    base = BayesianParams(C=2, W=10)
    (row,) = bayesian_eval.ceiling(
        SC.users, SC.p_private, SC.prior, base, [1.0], 1, 0, S_values=(0.5, 1.0), rho_values=(0.3,)
    )
    assert row["S"] in (1.0, 2.0) and row["rho"] == 0.3
