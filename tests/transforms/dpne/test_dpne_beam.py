"""Beam DPNE == in-memory reference under a fixed seed; the extract_ngrams CLI end to end."""

import glob
import gzip
import json
import os
import tempfile

import apache_beam as beam
import pytest

from dp_partition_beam.pipelines import extract_ngrams
from dp_partition_beam.privacy.dpne import DPNEParams
from dp_partition_beam.transforms.dpne import reference
from dp_partition_beam.transforms.dpne.dpne import DPNE
from dp_partition_beam.transforms.dpne.reference import dpne_reference, user_kgrams
from dp_partition_beam.transforms.testing.synthetic import markov_corpus

from tests.support.beam_helpers import collect_branches, make_test_pipeline
from tests.support.dpne_cases import branch, outputs, untag

SEED = 2024


@pytest.fixture(scope="module")
def records():
    recs = markov_corpus(500, vocab=40, branching=3, seed=9)
    out = [(u, "\n".join(lines)) for u, lines in recs.items()]
    out.append(("user000001", "w1 w2 extra line"))  # a user with two records
    return out


def run_beam(records, params, seed, mode="in_memory", workers=None, algorithm="dpne"):
    with tempfile.TemporaryDirectory() as tmp:
        with make_test_pipeline(mode, workers) as p:
            out = p | beam.Create(records) | beam.Reshuffle() | DPNE(algorithm, params, seed=seed, num_shards=3)
            _ = (
                out["ngrams"]
                | "Fmt" >> beam.Map(extract_ngrams.format_ngram)
                | "W1" >> beam.io.WriteToText(os.path.join(tmp, "ng"))
            )
            _ = (
                out["levels"]
                | "Json" >> beam.Map(json.dumps, sort_keys=True)
                | "W2" >> beam.io.WriteToText(os.path.join(tmp, "lv"))
            )

        def read(prefix):
            return [l.rstrip("\n") for f in sorted(glob.glob(os.path.join(tmp, prefix) + "*")) for l in open(f)]

        return sorted(read("ng")), [json.loads(x) for x in read("lv")]


def level_key(d):
    return d.get("k", 0), d.get("run", "")


BOTH = DPNEParams(epsilon=4, delta=1e-5, max_n=4, max_contributions=15, eta=0.3)
SINGLE_SAMPLE = DPNEParams(
    epsilon=4,
    delta=1e-5,
    max_n=4,
    max_contributions=(15, 10, 10, 5),
    eta=0.3,
    pruning="single",
    vk_method="sample",
    sample_rate=0.3,
    sigma_decay=0.8,
)

CONFIGS = [
    # the paper's Gaussian levels and the keep tables (the default) on each pruning
    *(
        pytest.param("dpne", params.replace(threshold=threshold), id=f"dpne-{name}-{threshold}")
        for name, params in (("both", BOTH), ("single-sample", SINGLE_SAMPLE))
        for threshold in ("gaussian", "optimal")
    ),
    pytest.param("dpsu_all", DPNEParams(epsilon=4, delta=1e-5, max_n=3, max_contributions=10), id="dpsu_all"),
    pytest.param("dpsu_even", DPNEParams(epsilon=4, delta=1e-5, max_n=3, max_contributions=10), id="dpsu_even"),
    pytest.param(
        "dpsu_single",
        DPNEParams(epsilon=4, delta=1e-5, max_n=3, max_contributions=10, dpsu_single_length=2),
        id="dpsu_single",
    ),
]


@pytest.mark.parametrize("algorithm,params", CONFIGS)
def test_beam_equals_reference_in_memory(records, algorithm, params):
    want = dpne_reference(records, algorithm, params, seed=SEED)
    got, levels = run_beam(records, params, SEED, algorithm=algorithm)
    assert got == want.lines()
    assert sorted(levels, key=level_key) == sorted(want.levels, key=level_key)
    if algorithm == "dpne":
        assert len(want.ngrams[2]) > 0 and len(want.ngrams[3]) > 0
        # the spurious mechanism ran (expected spurious > 0 at eta=0.3)
        assert sum(l.get("expected_spurious_bound", 0) for l in want.levels) > 1


def test_beam_equals_reference_mad(records):
    params = DPNEParams(epsilon=4, delta=1e-5, max_n=3, max_contributions=15, eta=0.3, weighting="mad", d_max=20)
    want = dpne_reference(records, "dpne", params, seed=SEED)
    got, levels = run_beam(records, params, SEED)
    assert got == want.lines()
    assert sorted(levels, key=level_key) == sorted(want.levels, key=level_key)


@pytest.mark.parametrize("selection", ["single", "mad_sips"])
def test_unseeded_beam_runs_and_is_downward_closed(records, selection):
    params = DPNEParams(epsilon=4, delta=1e-5, max_n=3, max_contributions=15, eta=0.3, selection=selection)
    got, levels = run_beam(records, params, None)
    out = {}
    for line in got:
        k, g = line.split("\t")
        out.setdefault(int(k), set()).add(g)
    for k in (2, 3):
        for g in out.get(k, ()):
            assert g.rsplit(" ", 1)[0] in out[k - 1] and g.split(" ", 1)[1] in out[k - 1]
    assert sum(l["released"] for l in levels) == len(got) > 0
    if selection == "mad_sips":
        assert all(l["released"] == sum(rd["released"] for rd in l["rounds"]) for l in levels)


# ---------------------------------------------------------------------------------------------
# selection='mad_sips': MAD-SIPS's rounds inside each level (reference: level_mad_sips)
# ---------------------------------------------------------------------------------------------

MAD_SIPS = dict(epsilon=4, delta=1e-5, max_n=3, max_contributions=15, eta=0.3, selection="mad_sips")


def check_mad_sips(records, params):
    want = dpne_reference(records, "dpne", params, seed=SEED)
    got, levels = run_beam(records, params, SEED)
    return check_mad_sips_result(params, want, got, levels)


def check_mad_sips_result(params, want, got, levels):
    assert got == want.lines()
    assert sorted(levels, key=level_key) == sorted(want.levels, key=level_key)
    assert [len(l["rounds"]) for l in levels] == [len(params.budget_split)] * params.max_n
    # every level released something, in more than one round overall, with spurious draws at k >= 2
    assert all(len(want.ngrams[k]) > 0 for k in range(1, params.max_n + 1))
    assert sum(1 for l in want.levels for rd in l["rounds"][1:] if rd["released"] > 0) > 0
    return want, got


def test_mad_sips_beam_equals_reference(records):
    check_mad_sips(records, DPNEParams(**MAD_SIPS))


def test_mad_sips_beam_equals_reference_three_rounds(records):
    check_mad_sips(records, DPNEParams(**{**MAD_SIPS, "budget_split": (0.2, 0.3, 0.5)}))


def test_mad_sips_beam_equals_reference_with_counts(records):
    params = DPNEParams(**{**MAD_SIPS, "release_counts": True, "min_users": 2})
    want = dpne_reference(records, "dpne", params, seed=SEED)
    with tempfile.TemporaryDirectory() as tmp:
        with make_test_pipeline("in_memory") as p:
            out = p | beam.Create(records) | beam.Reshuffle() | DPNE("dpne", params, seed=SEED, num_shards=3)
            _ = (
                out["counts"]
                | "Fmt" >> beam.MapTuple(lambda k, gc: f"{k}\t{gc[0]}\t{gc[1]}")
                | "W" >> beam.io.WriteToText(os.path.join(tmp, "c"))
            )
        got = sorted(l.rstrip("\n") for f in glob.glob(os.path.join(tmp, "c*")) for l in open(f))
    expected = sorted(f"{k}\t{g}\t{c}" for k, per_k in want.counts.items() for g, c in per_k.items())
    assert got == expected and len(expected) > 0  # counts on round 1's capped sets, as the reference's


MULTI_PROCESSING = {
    threshold: DPNEParams(epsilon=4, delta=1e-5, max_n=3, max_contributions=15, eta=0.3, threshold=threshold)
    for threshold in ("gaussian", "optimal")
}


@pytest.fixture(scope="module")
def multi_processing(records):
    """The multi_processing cases (two worker processes) as labelled branches of ONE pipeline, so the workers
    start once: ``{case: (reference, n-gram lines, level dicts)}``; a failing case is named by its branch."""
    cases = {**MULTI_PROCESSING, "mad_sips": DPNEParams(**{**MAD_SIPS, "max_n": 2})}

    def build(params):
        return branch(
            lambda p: outputs(
                p
                | "Create" >> beam.Create(records)
                | "Reshuffle" >> beam.Reshuffle()
                | "DPNE" >> DPNE("dpne", params, seed=SEED, num_shards=3)
            )
        )

    lines = collect_branches({name: build(params) for name, params in cases.items()}, "multi_processing", 2)
    out = {}
    for name, params in cases.items():
        got = untag(lines[name])
        out[name] = (dpne_reference(records, "dpne", params, seed=SEED), got["ngrams"], got["levels"])
    return out


@pytest.mark.parametrize("threshold", list(MULTI_PROCESSING))
def test_beam_equals_reference_multi_processing(multi_processing, threshold):
    want, got, levels = multi_processing[threshold]
    assert got == want.lines()
    assert levels == sorted(want.levels, key=level_key)


def test_mad_sips_beam_equals_reference_multi_processing(multi_processing):
    check_mad_sips_result(DPNEParams(**{**MAD_SIPS, "max_n": 2}), *multi_processing["mad_sips"])


@pytest.mark.parametrize(
    "vocab,cap,known_domain",
    [pytest.param(40, 3, True, id="levels-k>=2"), pytest.param(150, 2, False, id="level-1")],
)
def test_mad_sips_resubsampling_and_absent_entries(monkeypatch, vocab, cap, known_domain):
    """Users hold more n-grams than Delta_k: each round re-subsamples, and round 2 needs the previous round's
    entries of n-grams outside its support (level 1: pure noise; k >= 2: the truncated draw)."""
    recs = markov_corpus(500, vocab=vocab, branching=3, seed=9)
    records = [(u, "\n".join(lines)) for u, lines in recs.items()]
    params = DPNEParams(**{**MAD_SIPS, "max_contributions": cap})
    assert max(len(gs) for gs in user_kgrams(records, 1)[1].values()) > cap  # re-subsampling happens
    absent = []
    original = reference.absent_entries

    def recording(items, prev, known, seed, rng):
        absent.append((known, len(items)))
        return original(items, prev, known, seed, rng)

    monkeypatch.setattr(reference, "absent_entries", recording)
    check_mad_sips(records, params)
    assert any(known == known_domain and n > 0 for known, n in absent), absent  # absent entries were needed


def test_cli_end_to_end(records, tmp_path):
    inp = tmp_path / "in.jsonl.gz"
    with gzip.open(inp, "wt", encoding="utf-8") as f:
        for u, t in records:
            f.write(json.dumps({"user": u, "text": t}) + "\n")
    tsv = tmp_path / "in.tsv"
    with open(tsv, "w", encoding="utf-8") as f:
        for u, t in records:
            for line in t.split("\n"):
                f.write(f"{u}\t{line}\n")
    params = DPNEParams(epsilon=4, delta=1e-5, max_n=3, max_contributions=15, eta=0.3)
    want = dpne_reference(records, "dpne", params, seed=5).lines()
    for fmt, path in (("jsonl", inp), ("tsv", tsv)):
        out, rep = tmp_path / f"out_{fmt}", tmp_path / f"rep_{fmt}.json"
        rc = extract_ngrams.run(
            [
                "--input",
                str(path),
                "--input_format",
                fmt,
                "--output",
                str(out),
                "--report",
                str(rep),
                "--max_n",
                "3",
                "--epsilon",
                "4",
                "--delta",
                "1e-5",
                "--max_contributions",
                "15",
                "--eta",
                "0.3",
                "--seed",
                "5",
                "--direct_running_mode=in_memory",
            ]
        )
        assert rc == 0
        lines = sorted(l.rstrip("\n") for f in glob.glob(str(out) + "*") for l in open(f, encoding="utf-8"))
        assert lines == want  # same n-grams whether a user's lines come as one record or many
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
    inp = tmp_path / "in.jsonl.gz"
    with gzip.open(inp, "wt", encoding="utf-8") as f:
        for u, t in records:
            f.write(json.dumps({"user": u, "text": t}) + "\n")
    params = DPNEParams(epsilon=4, delta=1e-7, max_n=3, max_contributions=15, selection="mad_sips")
    want = dpne_reference(records, "dpne", params, seed=3)
    out, rep = tmp_path / "out", tmp_path / "rep.json"
    args = ["--input", str(inp), "--input_format", "jsonl", "--output", str(out), "--report", str(rep)]
    args += ["--max_n", "3", "--epsilon", "4", "--delta", "1e-7", "--max_contributions", "15"]
    args += ["--selection", "mad_sips", "--seed", "3", "--direct_running_mode=in_memory"]
    assert extract_ngrams.run(args) == 0
    lines = sorted(l.rstrip("\n") for f in glob.glob(str(out) + "*") for l in open(f, encoding="utf-8"))
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


def test_mad_sips_level_that_no_user_reaches_still_draws_its_spurious_k_grams():
    """Every text has two words: no user holds a 3-gram, but V_3 (from the released bigrams) is not empty, so
    level 3's chain carries only its spurious draws (no user rows) through both rounds: Beam == reference."""
    words = [f"w{i}" for i in range(6)]
    records = [(f"u{u:04d}", f"{words[u % 6]} {words[(u // 6) % 6]}") for u in range(1200)]
    params = DPNEParams(epsilon=8, delta=1e-5, max_n=3, max_contributions=4, eta=0.9, selection="mad_sips")
    want = dpne_reference(records, "dpne", params, seed=SEED)
    assert want.levels[2]["v_k"] > 0 and want.ngrams[3]  # level 3: released from the draws alone
    got, levels = run_beam(records, params, SEED)
    assert got == want.lines()
    assert sorted(levels, key=level_key) == sorted(want.levels, key=level_key)
