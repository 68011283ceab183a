"""Beam BayesianNgrams == the in-memory reference under a seed; unseeded outputs are distributions."""

import math
import random

import apache_beam as beam
import numpy as np
import pytest

from dp_partition_beam.privacy.bayesian import BayesianParams
from dp_partition_beam.transforms.bayesian import bayesian_kernels as K
from dp_partition_beam.transforms.bayesian.bayesian import BayesianNgrams
from dp_partition_beam.transforms.bayesian.reference import release

from tests.support.beam_helpers import collect, collect_branches
from tests.support.dpne_cases import FORMATS, branch

WORDS = ["the", "a", "fix", "bug", "add", "test", "docs", "update"]


def make_texts(seed=11, users=80):
    rnd = random.Random(seed)
    texts = {}
    for u in range(users):
        docs = []
        for _ in range(rnd.randint(1, 3)):
            lines = [
                " ".join(rnd.choice(WORDS[: rnd.randint(3, 8)]) for _ in range(rnd.randint(1, 9)))
                for _ in range(rnd.randint(1, 3))
            ]
            docs.append("\n".join(lines))
        texts[f"user{u}"] = docs
    return texts


TEXTS = make_texts()
RECORDS = [(u, t) for u, docs in TEXTS.items() for t in docs]
PRIOR = K.PublicPrior.from_counts(
    {
        f"{a} {b}": float((i * 7 + j * 3) % 11)
        for i, a in enumerate(WORDS)
        for j, b in enumerate(WORDS)
        if (i + j) % 3 != 0
    }
    | {"not private": 5.0}
)


def run_beam(params, seed, mode="in_memory", workers=None, records=RECORDS, algorithm="bayesian"):
    def build(p):
        return (p | beam.Create(records) | BayesianNgrams(algorithm, PRIOR, params, seed=seed))["distribution"]

    lines = collect(build, mode=mode, workers=workers, fmt=lambda kv: f"{kv[0]}\t{kv[1]!r}")
    return {l.split("\t")[0]: float(l.split("\t")[1]) for l in lines}


DD = "bayesian_data_dependent"


def dd(**kw):
    """Parameters of a data-dependent mechanism (acknowledged)."""
    return BayesianParams(acknowledge_data_dependent=True, **kw)


CASES = [
    ("bayesian", BayesianParams(n=2, C=2, W=6, epsilon=20.0)),  # the choice from the noisy counts
    ("bayesian", BayesianParams(n=2, C=1, W=4, S=0.3, rho=0.6, epsilon=20.0)),
    (DD, dd(n=2, C=2, W=6)),
    (DD, dd(n=2, C=1, W=4, S=0.3, rho=0.6, sensitivity="bound")),
    (
        DD,
        dd(n=2, C=2, W=6, tune=True, validation_fraction=0.3, S_grid=(0.01, 0.3, 3.0), rho_grid=(0.2, 0.8)),
    ),
    (DD, dd(n=2, C=2, W=6, tune=True, sensitivity="bound", S_grid=(0.1, 1.0), rho_grid=(0.5,))),
    ("laplace", BayesianParams(n=2, C=3, W=10, epsilon=5.0)),
    ("laplace_public", dd(n=2, C=3, W=10, epsilon=5.0)),
]


IDS = [f"{a}-{p.sensitivity}-tune{p.tune}-S{p.S}" for a, p in CASES]
SEED_CHANGE = BayesianParams(n=2, C=2, W=6, S=1.0, rho=0.5)
NO_VOCABULARY = [("u1", "zzz yyy xxx"), ("u2", "nothing here")]
NO_VOCABULARY_TEXTS = [(u, [t]) for u, t in NO_VOCABULARY]


def _branch(params, seed, algorithm="bayesian", records=RECORDS):
    return branch(
        lambda p: (
            (p | "Create" >> beam.Create(records) | BayesianNgrams(algorithm, PRIOR, params, seed=seed))["distribution"]
            | "Format" >> beam.Map(FORMATS["distribution"])
        )
    )


def _distribution(lines):
    return {l.split("\t")[0]: float(l.split("\t")[1]) for l in lines}


@pytest.fixture(scope="module")
def seeded():
    """Every seeded in-memory case as a labelled branch of ONE pipeline: ``{case: distribution}`` (CASES under
    their ids at seed 7, SEED_CHANGE at seeds 1 and 2, the input without vocabulary n-grams at seed 9)."""
    builds = {name: _branch(params, 7, algorithm) for name, (algorithm, params) in zip(IDS, CASES)}
    builds["seed1"], builds["seed2"] = _branch(SEED_CHANGE, 1), _branch(SEED_CHANGE, 2)
    builds["no-vocabulary"] = _branch(dd(n=2, rho=0.4), 9, DD, records=NO_VOCABULARY)
    builds["default-no-vocabulary"] = _branch(BayesianParams(n=2, S=1.0, rho=0.4), 9, records=NO_VOCABULARY)
    return {name: _distribution(lines) for name, lines in collect_branches(builds).items()}


@pytest.mark.parametrize("algorithm,params", CASES, ids=IDS)
def test_beam_equals_reference(seeded, algorithm, params, request):
    want, _ = release(TEXTS, algorithm, PRIOR, params, seed=7)
    got = seeded[request.node.callspec.id]
    assert got == want  # bit for bit
    assert set(got) == set(PRIOR.vocab)
    assert math.fsum(got.values()) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("case", [0, 4], ids=["default", "tuned"])
def test_beam_equals_reference_multi_processing(case):
    algorithm, params = CASES[case]
    want, _ = release(TEXTS, algorithm, PRIOR, params, seed=3)
    assert run_beam(params, 3, mode="multi_processing", workers=2, algorithm=algorithm) == want


def test_seed_changes_output(seeded):
    assert seeded["seed1"] != seeded["seed2"]
    assert set(seeded["seed1"]) == set(seeded["seed2"]) == set(PRIOR.vocab)


UNSEEDED_CASES = [
    # explicit S, rho: the noise always reaches the output (a choice may return the public prior itself,
    # which has no noise: see test_unseeded_choice_is_a_distribution)
    ("bayesian", BayesianParams(n=2, C=2, W=6, S=1.0, rho=0.5)),
    (DD, dd(n=2, C=2, W=6, S=1e-3, rho=0.1)),
    CASES[5],
    CASES[6],
]


@pytest.mark.parametrize("algorithm,params", UNSEEDED_CASES, ids=["bayesian", "data-dependent", "tuned", "laplace"])
def test_unseeded_beam_output_is_a_distribution(algorithm, params):
    got = run_beam(params, None, algorithm=algorithm)
    vals = np.array(list(got.values()))
    assert set(got) == set(PRIOR.vocab)
    assert np.all(np.isfinite(vals)) and np.all(vals >= 0)
    assert math.fsum(vals) == pytest.approx(1.0, abs=1e-12)
    assert got != run_beam(params, None, algorithm=algorithm)  # fresh OS-entropy noise each run


@pytest.mark.parametrize("algorithm", ["bayesian", DD])
def test_unseeded_choice_is_a_distribution(algorithm):
    """A choice of S, rho (the default's from the noisy counts, the data-dependent mechanism's private one),
    unseeded: a distribution over the public vocabulary; either the public prior itself or a noisy release
    (two runs then differ)."""
    params = BayesianParams(n=2, C=2, W=6, epsilon=60.0, acknowledge_data_dependent=algorithm == DD)
    prior_theta = dict(zip(PRIOR.vocab, K.softmax(K.mu_prior(PRIOR.alpha)).tolist()))
    runs = [run_beam(params, None, algorithm=algorithm) for _ in range(2)]
    for got in runs:
        vals = np.array(list(got.values()))
        assert set(got) == set(PRIOR.vocab) and np.all(np.isfinite(vals)) and np.all(vals >= 0)
        assert math.fsum(vals) == pytest.approx(1.0, abs=1e-12)
    if runs[0] != prior_theta and runs[1] != prior_theta:
        assert runs[0] != runs[1]  # fresh OS-entropy noise in each release


def test_private_users_without_vocabulary_ngrams_and_empty_input(seeded):
    want = dict(zip(PRIOR.vocab, K.softmax(0.6 * K.mu_prior(PRIOR.alpha)).tolist()))
    assert seeded["no-vocabulary"] == pytest.approx(want, rel=1e-12)
    # the default adds its noise to the zero counts all the same (the noise never depends on the data)
    got, _ = release(dict(NO_VOCABULARY_TEXTS), "bayesian", PRIOR, BayesianParams(n=2, S=1.0, rho=0.4), seed=9)
    assert seeded["default-no-vocabulary"] == got != want
