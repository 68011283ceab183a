"""benchmarks/explore/explore_policy_gaussian_table.py: the necessary-condition bound on a Policy Gaussian keep rule.

What docs/thresholding.md ("Policy Gaussian") reads from it must hold: the bound table meets the exact-shift
condition it is built from (F[j + m] <= g_{mH}(F[j])), no other table is needed to state it (it is above the
one-cell-slack table, whose conditions are stronger, and it is monotone), and its W50 is below the Gaussian rule's
rho, which is what leaves room for a keep rule. A coarse grid (2^-4) keeps it fast."""

import math

import numpy as np

from benchmarks.explore import explore_policy_gaussian_table as X
from dp_partition_beam.privacy import l2_rule as L
from dp_partition_beam.privacy import thresholding as T

BITS = 4


def test_exact_shifts_move_the_index_by_the_shift():
    ms, cs = L.exact_shifts(BITS)
    assert ms.tolist() == list(range(1, (1 << BITS) + 1)) and np.allclose(cs, ms * math.ldexp(1.0, -BITS))
    sub_ms, sub_cs = L.exact_shifts(5, subset=True)
    assert set(sub_ms.tolist()) <= set(range(1, 33)) and np.all(sub_cs == sub_ms / 32.0)


def test_the_bound_meets_its_exact_shift_condition_and_lies_above_the_sufficient_table():
    bound = X.necessary_table(1.0, 1e-5, BITS)
    slack = X.one_cell_slack_table(1.0, 1e-5, BITS)
    p = np.asarray(bound.probs)
    assert np.all(np.diff(p) >= 0) and p[0] == 0.0 and bound.complete
    for m in range(1, (1 << BITS) + 1):
        c = m * bound.grid
        g = T.one_step(p, bound.alpha, bound.epsilon_rdp * c * c, bound.delta_rdp * c * c)
        padded = np.concatenate([p, np.full(m, p[-1])])  # past the end reads the last entry
        assert np.all(padded[m : m + len(p)] <= g), m  # the exact-shift condition, at the exact budget
    # the slack table satisfies m cells per (m - 1) H: a stronger condition, so its W50 cannot be lower (the two
    # are searched at their own order alpha, hence compared on W50 rather than entry by entry)
    assert slack.weight_for(0.5) > bound.weight_for(0.5)
    rho, _ = X.policy_gaussian_rule(1.0, 1e-5, 100)
    assert bound.weight_for(0.5) < 0.9 * rho  # room for a keep rule (17.0 against 20.8 at 2^-8, docs)


def test_main_prints_one_row_per_epsilon(capsys):
    X.main(["--epsilons", "4", "--bits", "3,4"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 4 |")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert float(cells[1]) > float(cells[4].split()[0]) > 0  # rho above the bound's W50
