"""Beam DPNE == in-memory reference under a fixed seed; the extract_ngrams CLI end to end.

Every in-memory case is a labelled branch of ONE module-scoped pipeline (``in_memory``) and every
multi_processing case a branch of another (``multi_processing``): a DPNE branch costs seconds of graph
construction whatever its data (a few hundred transforms at max_n=3), so the file builds each case's graph once
and pays a pipeline's fixed cost twice. Each (pruning, threshold) combination is one Beam branch: both-side
pruning with the keep tables and single-side pruning with a sampled |V_k| and Gaussian levels in memory, the
two other combinations in two worker processes (the stricter layer: the same runner, every DoFn pickled to a
worker, every side input crossing a process).
"""

import glob
import gzip
import json

import apache_beam as beam
import pytest

from dp_partition_beam.pipelines import extract_ngrams
from dp_partition_beam.privacy.dpne import DPNEParams
from dp_partition_beam.transforms.dpne import reference
from dp_partition_beam.transforms.dpne.dpne import DPNE
from dp_partition_beam.transforms.dpne.reference import dpne_reference, user_kgrams
from dp_partition_beam.transforms.testing.synthetic import markov_corpus

from tests.support.beam_helpers import collect_branches
from tests.support.dpne_cases import branch, level_key, outputs, untag

SEED = 2024


def markov_records(vocab):
    recs = markov_corpus(500, vocab=vocab, branching=3, seed=9)
    return [(u, "\n".join(lines)) for u, lines in recs.items()]


@pytest.fixture(scope="module")
def records():
    return markov_records(40) + [("user000001", "w1 w2 extra line")]  # a user with two records


def two_word_records():
    """Every text has two words: no user holds a 3-gram."""
    words = [f"w{i}" for i in range(6)]
    return [(f"u{u:04d}", f"{words[u % 6]} {words[(u // 6) % 6]}") for u in range(1200)]


# max_n=3: level 3 is the first whose pruning reads S_{k-1} != S_1 (a level 4 runs the same stages again and
# costs a third more graph); per-level caps where the case had them
BOTH = DPNEParams(epsilon=4, delta=1e-5, max_n=3, max_contributions=15, eta=0.3)
SINGLE_SAMPLE = DPNEParams(
    epsilon=4,
    delta=1e-5,
    max_n=3,
    max_contributions=(15, 10, 5),
    eta=0.3,
    pruning="single",
    vk_method="sample",
    sample_rate=0.3,
    sigma_decay=0.8,
)
DPSU = DPNEParams(epsilon=4, delta=1e-5, max_n=3, max_contributions=10)
MAD_SIPS = dict(epsilon=4, delta=1e-5, max_n=3, max_contributions=15, eta=0.3, selection="mad_sips")

#: in-memory cases: name -> (records, algorithm, params, seed, outputs)
IN_MEMORY = {
    "dpne-both-optimal": ("records", "dpne", BOTH.replace(threshold="optimal"), SEED, ("ngrams", "levels")),
    "dpne-single-sample-gaussian": (
        "records",
        "dpne",
        SINGLE_SAMPLE.replace(threshold="gaussian"),
        SEED,
        ("ngrams", "levels"),
    ),
    # |V_k| estimated by sampling (supplement Alg. 2): the only pruning that reads the estimate is "both"
    # (SINGLE_SAMPLE's pruning "single" computes |V_k| exactly), so this is the case that runs EstimateValidFn
    "dpne-both-sample-gaussian": (
        "records",
        "dpne",
        BOTH.replace(threshold="gaussian", vk_method="sample", sample_rate=0.3),
        SEED,
        ("ngrams", "levels"),
    ),
    "dpsu_all": ("records", "dpsu_all", DPSU, SEED, ("ngrams", "levels")),
    "dpsu_even": ("records", "dpsu_even", DPSU, SEED, ("ngrams", "levels")),
    "dpsu_single": ("records", "dpsu_single", DPSU.replace(dpsu_single_length=2), SEED, ("ngrams", "levels")),
    "mad": ("records", "dpne", BOTH.replace(weighting="mad", d_max=20), SEED, ("ngrams", "levels")),
    # MAD-SIPS's rounds inside each level (reference: level_mad_sips)
    "mad_sips-counts": (
        "records",
        "dpne",
        DPNEParams(**{**MAD_SIPS, "release_counts": True, "min_users": 2}),
        SEED,
        ("ngrams", "levels", "counts"),
    ),
    # Delta_k = 3 < what users hold: every round re-subsamples (levels k >= 2 need absent entries)
    "mad_sips-3-rounds-cap3": (
        "records",
        "dpne",
        DPNEParams(**{**MAD_SIPS, "budget_split": (0.2, 0.3, 0.5), "max_contributions": 3}),
        SEED,
        ("ngrams", "levels"),
    ),
    # 150 words, Delta_k = 2: round 2 of level 1 needs words outside round 1's support (pure noise)
    "mad_sips-vocab150-cap2": (
        "vocab150",
        "dpne",
        DPNEParams(**{**MAD_SIPS, "max_contributions": 2}),
        SEED,
        ("ngrams", "levels"),
    ),
    "mad_sips-level-nobody-reaches": (
        "two-words",
        "dpne",
        DPNEParams(epsilon=8, delta=1e-5, max_n=3, max_contributions=4, eta=0.9, selection="mad_sips"),
        SEED,
        ("ngrams", "levels"),
    ),
    "unseeded-single": ("records", "dpne", BOTH.replace(selection="single"), None, ("ngrams", "levels")),
    "unseeded-mad_sips": ("records", "dpne", DPNEParams(**MAD_SIPS), None, ("ngrams", "levels")),
}

#: multi_processing cases (two worker processes), outputs 'ngrams' and 'levels'
MULTI_PROCESSING = {
    "dpne-both-gaussian": BOTH.replace(threshold="gaussian"),
    "dpne-single-sample-optimal": SINGLE_SAMPLE.replace(threshold="optimal"),
    "mad_sips": DPNEParams(**{**MAD_SIPS, "max_n": 2}),
}


def dpne_branch(records, algorithm, params, seed, names):
    return branch(
        lambda p: outputs(
            p
            | "Create" >> beam.Create(records)
            | "Reshuffle" >> beam.Reshuffle()
            | "DPNE" >> DPNE(algorithm, params, seed=seed, num_shards=3),
            names,
        )
    )


@pytest.fixture(scope="module")
def datasets(records):
    return {"records": records, "vocab150": markov_records(150), "two-words": two_word_records()}


@pytest.fixture(scope="module")
def want(datasets):
    """Every seeded in-memory case's reference, and the absent-entry queries (known domain, count) it made."""
    out = {}
    for name, (data, algorithm, params, seed, _) in IN_MEMORY.items():
        if seed is None:
            continue
        absent = []
        original = reference.absent_entries

        def recording(items, prev, known, seed, rng, absent=absent):
            absent.append((known, len(items)))
            return original(items, prev, known, seed, rng)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(reference, "absent_entries", recording)
            out[name] = (dpne_reference(datasets[data], algorithm, params, seed=seed), absent)
    return out


@pytest.fixture(scope="module")
def in_memory(datasets):
    """Every in-memory case as a labelled branch of ONE pipeline: ``{case: {output: sorted lines}}``."""
    builds = {name: dpne_branch(datasets[data], *case) for name, (data, *case) in IN_MEMORY.items()}
    lines = collect_branches(builds)
    return {name: untag(lines[name], IN_MEMORY[name][-1]) for name in IN_MEMORY}


@pytest.fixture(scope="module")
def multi_processing(records):
    """The multi_processing cases (two worker processes) as labelled branches of ONE pipeline, so the workers
    start once: ``{case: (reference, n-gram lines, level dicts)}``; a failing case is named by its branch."""
    builds = {
        name: dpne_branch(records, "dpne", params, SEED, ("ngrams", "levels"))
        for name, params in MULTI_PROCESSING.items()
    }
    lines = collect_branches(builds, "multi_processing", 2)
    out = {}
    for name, params in MULTI_PROCESSING.items():
        got = untag(lines[name])
        out[name] = (dpne_reference(records, "dpne", params, seed=SEED), got["ngrams"], got["levels"])
    return out


def check_equal(want, got, levels, algorithm):
    assert got == want.lines()
    assert levels == sorted(want.levels, key=level_key)
    if algorithm == "dpne":
        assert len(want.ngrams[2]) > 0 and len(want.ngrams[3]) > 0
        # the spurious mechanism ran (expected spurious > 0 at eta=0.3)
        assert sum(l.get("expected_spurious_bound", 0) for l in want.levels) > 1
    else:
        assert len(got) > 0


@pytest.mark.parametrize(
    "case",
    [
        "dpne-both-optimal",
        "dpne-single-sample-gaussian",
        "dpne-both-sample-gaussian",
        "dpsu_all",
        "dpsu_even",
        "dpsu_single",
    ],
)
def test_beam_equals_reference_in_memory(in_memory, want, case):
    got = in_memory[case]
    check_equal(want[case][0], got["ngrams"], got["levels"], IN_MEMORY[case][1])


@pytest.mark.parametrize("case", ["dpne-both-gaussian", "dpne-single-sample-optimal"])
def test_beam_equals_reference_multi_processing(multi_processing, case):
    check_equal(*multi_processing[case], "dpne")


def test_beam_equals_reference_mad(in_memory, want):
    got = in_memory["mad"]
    assert got["ngrams"] == want["mad"][0].lines() and len(got["ngrams"]) > 0
    assert got["levels"] == sorted(want["mad"][0].levels, key=level_key)


@pytest.mark.parametrize("selection", ["single", "mad_sips"])
def test_unseeded_beam_runs_and_is_downward_closed(in_memory, selection):
    got = in_memory[f"unseeded-{selection}"]
    levels = got["levels"]
    out = {}
    for line in got["ngrams"]:
        k, g = line.split("\t")
        out.setdefault(int(k), set()).add(g)
    for k in (2, 3):
        for g in out.get(k, ()):
            assert g.rsplit(" ", 1)[0] in out[k - 1] and g.split(" ", 1)[1] in out[k - 1]
    assert sum(l["released"] for l in levels) == len(got["ngrams"]) > 0
    if selection == "mad_sips":
        assert all(l["released"] == sum(rd["released"] for rd in l["rounds"]) for l in levels)


# ---------------------------------------------------------------------------------------------
# selection='mad_sips': MAD-SIPS's rounds inside each level (reference: level_mad_sips)
# ---------------------------------------------------------------------------------------------


def check_mad_sips_result(params, want, got, levels):
    assert got == want.lines()
    assert levels == sorted(want.levels, key=level_key)
    assert [len(l["rounds"]) for l in levels] == [len(params.budget_split)] * params.max_n
    # every level released something, in more than one round overall, with spurious draws at k >= 2
    assert all(len(want.ngrams[k]) > 0 for k in range(1, params.max_n + 1))
    assert sum(1 for l in want.levels for rd in l["rounds"][1:] if rd["released"] > 0) > 0
    return want, got


def check_mad_sips(in_memory, want, case):
    return check_mad_sips_result(
        IN_MEMORY[case][2], want[case][0], in_memory[case]["ngrams"], in_memory[case]["levels"]
    )


def test_mad_sips_beam_equals_reference_with_counts(in_memory, want):
    """The default two rounds with counts and a floor of 2 users: n-grams, levels and counts == the reference's
    (the cases without counts: three rounds, re-subsampling, the level nobody reaches, multi_processing)."""
    ref, _ = check_mad_sips(in_memory, want, "mad_sips-counts")
    expected = sorted(f"{k}\t{g}\t{c}" for k, per_k in ref.counts.items() for g, c in per_k.items())
    got = in_memory["mad_sips-counts"]["counts"]
    assert got == expected and len(expected) > 0  # counts on round 1's capped sets, as the reference's


def test_mad_sips_beam_equals_reference_three_rounds(in_memory, want):
    check_mad_sips(in_memory, want, "mad_sips-3-rounds-cap3")


def test_mad_sips_beam_equals_reference_multi_processing(multi_processing):
    check_mad_sips_result(MULTI_PROCESSING["mad_sips"], *multi_processing["mad_sips"])


@pytest.mark.parametrize(
    "case,known_domain",
    [
        pytest.param("mad_sips-3-rounds-cap3", True, id="levels-k>=2"),
        pytest.param("mad_sips-vocab150-cap2", False, id="level-1"),
    ],
)
def test_mad_sips_resubsampling_and_absent_entries(datasets, in_memory, want, case, known_domain):
    """Users hold more n-grams than Delta_k: each round re-subsamples, and round r >= 2 needs the previous round's
    entries of n-grams outside its support (level 1: pure noise; k >= 2: the truncated draw)."""
    data, _, params, _, _ = IN_MEMORY[case]
    cap = params.max_contributions[0] if isinstance(params.max_contributions, tuple) else params.max_contributions
    assert max(len(gs) for gs in user_kgrams(datasets[data], 1)[1].values()) > cap  # re-subsampling happens
    check_mad_sips(in_memory, want, case)
    absent = want[case][1]
    assert any(known == known_domain and n > 0 for known, n in absent), absent  # absent entries were needed


def test_mad_sips_level_that_no_user_reaches_still_draws_its_spurious_k_grams(in_memory, want):
    """Every text has two words: no user holds a 3-gram, but V_3 (from the released bigrams) is not empty, so
    level 3's chain carries only its spurious draws (no user rows) through both rounds: Beam == reference."""
    ref = want["mad_sips-level-nobody-reaches"][0]
    assert ref.levels[2]["v_k"] > 0 and ref.ngrams[3]  # level 3: released from the draws alone
    got = in_memory["mad_sips-level-nobody-reaches"]
    assert got["ngrams"] == ref.lines()
    assert got["levels"] == sorted(ref.levels, key=level_key)


# ---------------------------------------------------------------------------------------------
# The CLI: one run per input format (jsonl: a user's lines in one record; tsv: one row per line), each
# against the reference on the records
# ---------------------------------------------------------------------------------------------


def write_jsonl(records, path):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for u, t in records:
            f.write(json.dumps({"user": u, "text": t}) + "\n")


def write_tsv(records, path):
    with open(path, "w", encoding="utf-8") as f:
        for u, t in records:
            for line in t.split("\n"):
                f.write(f"{u}\t{line}\n")


def read_output(out):
    return sorted(l.rstrip("\n") for f in glob.glob(str(out) + "*") for l in open(f, encoding="utf-8"))


def test_cli_end_to_end(records, tmp_path):
    """jsonl input (a user's lines in one record, one user in two records), the default selection and keep
    tables: the reference's n-grams and a report of public quantities only."""
    inp = tmp_path / "in.jsonl.gz"
    write_jsonl(records, inp)
    params = DPNEParams(epsilon=4, delta=1e-5, max_n=3, max_contributions=15, eta=0.3)
    want = dpne_reference(records, "dpne", params, seed=5).lines()
    out, rep = tmp_path / "out", tmp_path / "rep.json"
    args = ["--input", str(inp), "--input_format", "jsonl", "--output", str(out), "--report", str(rep)]
    args += ["--max_n", "3", "--epsilon", "4", "--delta", "1e-5", "--max_contributions", "15", "--eta", "0.3"]
    assert extract_ngrams.run(args + ["--seed", "5", "--direct_running_mode=in_memory"]) == 0
    lines = read_output(out)
    assert lines == want
    report = json.loads(rep.read_text())
    assert report["released"] == len(lines) and report["epsilon"] == 4 and report["delta"] == 1e-5
    assert [l["k"] for l in report["levels"]] == [1, 2, 3]
    assert report["threshold"] == "optimal" and report["sigma_star"] is None  # keep tables, the default
    assert 4 * (1 - 1e-9) <= report["epsilon_bound"] <= 4 and report["total_delta_bound"] <= 1e-5
    for l in report["levels"][1:]:
        assert {"keep_table", "v_k", "s_prev", "spurious_prob", "expected_spurious_bound", "released"} <= set(l)
        assert l["keep_table"]["alpha"] == report["rdp"]["alpha"]
    text = rep.read_text()
    assert "supp" not in text  # |supp(H_k)| is private


def test_cli_mad_sips_equals_reference(records, tmp_path):
    """tsv input (one row per line of a user's text) with --selection mad_sips: the reference's n-grams on the
    records (whose texts hold several lines each) and its levels."""
    inp = tmp_path / "in.tsv"
    write_tsv(records, inp)
    params = DPNEParams(epsilon=4, delta=1e-7, max_n=3, max_contributions=15, selection="mad_sips")
    want = dpne_reference(records, "dpne", params, seed=3)
    out, rep = tmp_path / "out", tmp_path / "rep.json"
    args = ["--input", str(inp), "--input_format", "tsv", "--output", str(out), "--report", str(rep)]
    args += ["--max_n", "3", "--epsilon", "4", "--delta", "1e-7", "--max_contributions", "15"]
    args += ["--selection", "mad_sips", "--seed", "3", "--direct_running_mode=in_memory"]
    assert extract_ngrams.run(args) == 0
    lines = read_output(out)
    assert lines == want.lines() and len(lines) > 0
    report = json.loads(rep.read_text())
    assert report["levels"] == want.levels


def test_cli_rejects_bad_parameters(tmp_path, capsys):
    with pytest.raises(SystemExit):
        extract_ngrams.run(
            [
                "--input",
                "x",
                "--input_format",
                "jsonl",
                "--output",
                "o",
                "--report",
                "r",
                "--max_n",
                "3",
                "--epsilon",
                "4",
                "--delta",
                "1e-7",
                "--max_contributions",
                "1,2",
            ]
        )
    assert "max_contributions must be one integer or a list of max_n=3" in capsys.readouterr().err
