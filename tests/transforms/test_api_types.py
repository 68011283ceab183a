"""The Python API checks its input elements at entry, the tokenizer's output is checked, and the Bayesian
report states its guarantee honestly (issue 27, points 7, 9 (tokenizer) and 10).

Every bad element carries the marker ``SECRET`` in its content: no message may contain it (an element's
content is private data; a message names its type and, for a dict, its keys).
"""

import glob
import json
import re

import apache_beam as beam
import pyarrow as pa
import pytest

from dp_partition_beam.pipelines import bayesian_ngrams, extract_ngrams
from dp_partition_beam.privacy import BayesianParams, DPNEParams, SelectionParams
from dp_partition_beam.privacy.bayesian import DATA_DEPENDENT
from dp_partition_beam.transforms import DPNE, BayesianNgrams, SelectPartitions, reference
from dp_partition_beam.transforms.bayesian import bayesian_kernels as BK
from dp_partition_beam.transforms.bayesian.bayesian import UserNgramCountsFn
from dp_partition_beam.transforms.core import elements as E
from dp_partition_beam.transforms.core import text as tx
from dp_partition_beam.transforms.core.batches import _ToBatchesFn, normalise_batch
from dp_partition_beam.transforms.core.fingerprint import from_key_bytes
from dp_partition_beam.transforms.dpne import dpne_kernels as CK
from dp_partition_beam.transforms.dpne.dpne import ToTextBatchesFn
from dp_partition_beam.transforms.selection.select import AsPairsFn

import tests.support.tokenizers_for_tests as bad_tok
from tests.pipelines.test_cli_bayesian import PRIOR as CLI_PRIOR
from tests.pipelines.test_cli_bayesian import write_private, write_public
from tests.support.beam_helpers import collect, make_test_pipeline

PARAMS = SelectionParams(epsilon=2.0, delta=1e-5, max_contributions=4)
S = "SECRET"

# --- 1. element checks: SelectPartitions ---------------------------------------------------------------

SELECT_BAD = [
    ({"user": S, "item": S}, "got dict with keys ['user', 'item']"),
    ({"k" * 40: S, 1: S}, "got dict with keys ['kkkkkkkkkkkkkkkkkkkkkkkkkkkkkk...', int]"),
    ((None, S), "got tuple (NoneType, str) whose user is None"),
    ((S, None), "got tuple (str, NoneType) whose item is None"),
    ((S, [S]), "got tuple (str, list) whose item is a list"),
    ((S, {S}), "got tuple (str, set) whose item is a set"),
    ((S, 1.5), "got tuple (str, float) whose item is a float"),
    ((S, True), "got tuple (str, bool) whose item is a bool"),
    ((True, S), "got tuple (bool, str) whose user is a bool"),
    ((S, (S, None)), "got tuple (str, tuple) whose item is a tuple holding None"),
    ((S, b""), "got tuple (str, bytes) whose item is empty bytes"),
    ((S, ()), "got tuple (str, tuple) whose item is an empty tuple"),
    ((S, " \t\n"), "got a (user, item) pair with an item that is only whitespace"),
    ((S, ""), "got a (user, item) pair with an empty item"),
    (("", S), "got a (user, item) pair with an empty user"),
    (S[:2], "got str"),
    ((S, S, S), "got tuple of 3"),
    (None, "got NoneType"),
    (7, "got int"),
]


def _batches_of(elements, batch_rows=1000):
    fn = _ToBatchesFn(batch_rows)
    fn.start_bundle()
    out = [t for e in elements for t in fn.process(e)]
    return out + [wv.value for wv in fn.finish_bundle()]


@pytest.mark.parametrize("bad, got", SELECT_BAD, ids=[g for _, g in SELECT_BAD])
def test_select_entry_rejects_each_bad_element_naming_its_type_never_its_content(bad, got):
    with pytest.raises(E.InputElementError) as e:
        _batches_of([("u1", "a"), bad, ("u2", "b")])
    msg = str(e.value)
    assert msg.startswith(f"SelectPartitions expects {E.SELECT_SHAPE}; ") and msg.endswith(got), msg
    assert S not in msg and "\n" not in msg
    assert isinstance(e.value, TypeError)


@pytest.mark.parametrize("bad, got", SELECT_BAD, ids=[g for _, g in SELECT_BAD])
def test_sequential_policy_entry_rejects_the_same_elements(bad, got):
    with pytest.raises(E.InputElementError, match="SelectPartitions expects") as e:
        list(AsPairsFn().process(bad))
    assert S not in str(e.value)


def test_select_entry_accepts_typed_keys_lists_and_str_subclasses():
    class Str(str):
        pass

    elements = [
        ("u1", "a\tb"),  # TAB and line breaks: accepted in the API (the CLI writes lines, so it rejects them)
        ["u1", "c\nd"],  # a 2-list
        (7, b"x"),
        ("u2", (1, "y")),
        (Str("u3"), Str("z")),
        (" ", "w"),  # a whitespace-only user is a user (as in the CLI)
    ]
    (table,) = _batches_of(elements)
    pairs = list(
        zip(
            map(from_key_bytes, table.column("user").to_pylist()), map(from_key_bytes, table.column("item").to_pylist())
        )
    )
    assert pairs == [("u1", "a\tb"), ("u1", "c\nd"), (7, b"x"), ("u2", (1, "y")), ("u3", "z"), (" ", "w")]
    assert [type(u) for u, _ in pairs] == [str, str, int, str, str, str]
    assert list(AsPairsFn().process(["u1", "c"])) == [("u1", "c")]  # the sequential path: a tuple


BATCH_BAD = [
    (pa.table({"user": [S], "it": [S]}), "got Table with columns ['user', 'it'] (needs columns 'user' and 'item')"),
    (pa.table({"user": [S, None], "item": [S, S]}), "got Table whose column 'user' has null values"),
    (
        pa.RecordBatch.from_pydict({"user": [S], "item": [1]}),  # pa.record_batch(dict): pyarrow >= 11 only
        "got RecordBatch whose column 'item' is int64 (must be string or binary)",
    ),
    (pa.table({"user": [S, S], "item": [S, "  "]}), "got a batch with an item that is only whitespace"),
    (pa.table({"user": [S, S], "item": [S, ""]}), "got a batch with an empty item"),
    (pa.table({"user": pa.array([b"", b"u"]), "item": [S, S]}), "got a batch with an empty user"),
]


@pytest.mark.parametrize("bad, got", BATCH_BAD, ids=[g for _, g in BATCH_BAD])
def test_select_batches_are_checked_per_batch(bad, got):
    with pytest.raises(E.InputElementError) as e:
        normalise_batch(bad)
    assert str(e.value) == f"SelectPartitions expects {E.SELECT_SHAPE}; {got}"
    with pytest.raises(E.InputElementError, match="null|empty|whitespace|columns|string or binary"):
        list(AsPairsFn().process(bad))


def test_json_dicts_through_a_pipeline_fail_with_the_message_not_a_silent_empty_release():
    """Issue 27 point 7: ``beam.Map(json.loads)`` into SelectPartitions used to release nothing, silently."""
    lines = [json.dumps({"user": f"u{i}", "item": S}) for i in range(50)]
    for algorithm in ("basic", "policy_gaussian"):  # the columnar path and the sequential one
        with pytest.raises(Exception) as e:
            with make_test_pipeline() as p:
                _ = p | beam.Create(lines) | beam.Map(json.loads) | SelectPartitions(algorithm, PARAMS, seed=1)
        text = str(e.value)
        assert (
            "SelectPartitions expects (user, item) pairs or Arrow batches: 2-tuples of non-empty strings "
            "(or int/bytes/tuple keys), or RecordBatch/Table with string or binary columns 'user' and 'item'; "
            "got dict with keys ['user', 'item']" in text
        ), (algorithm, text)
        assert S not in text and isinstance(e.value, TypeError)


def test_none_item_through_a_pipeline_is_rejected():
    pairs = [(f"u{i}", "a") for i in range(20)] + [("u1", None)]
    with pytest.raises(Exception, match=r"got tuple \(str, NoneType\) whose item is None"):
        collect(lambda p: p | beam.Create(pairs) | SelectPartitions("mad2r", PARAMS, seed=1))


def test_accepted_elements_release_as_the_reference():
    """2-lists and tuples are the same pairs: same seeded release as the reference."""
    pairs = [(f"u{u}", f"i{(u * 7 + j) % 13}") for u in range(400) for j in range(3)]
    want = reference.select(reference.user_sets_from_pairs(pairs), "basic", PARAMS, seed=5)
    elements = [list(p) if i % 2 else p for i, p in enumerate(pairs)]
    got = collect(lambda p: p | beam.Create(elements) | SelectPartitions("basic", PARAMS, seed=5))
    assert sorted(got) == sorted(want) and want


# --- 1. element checks: DPNE and BayesianNgrams ---------------------------------------------------------

TEXT_BAD = [
    ({"user": S, "text": S}, "got dict with keys ['user', 'text']"),
    ((S, None), "got tuple (str, NoneType) whose text is None"),
    ((S, [S]), "got tuple (str, list) whose text is a list"),
    ((S, b"x"), "got tuple (str, bytes) whose text is a bytes"),
    ((None, S), "got tuple (NoneType, str) whose user is None"),
    ((1.0, S), "got tuple (float, str) whose user is a float"),
    (S, "got str"),
]


@pytest.mark.parametrize("bad, got", TEXT_BAD, ids=[g for _, g in TEXT_BAD])
def test_dpne_entry_rejects_bad_elements(bad, got):
    fn = ToTextBatchesFn(100)
    fn.start_bundle()
    with pytest.raises(E.InputElementError) as e:
        list(fn.process(bad))
    assert str(e.value) == f"DPNE expects {E.DPNE_SHAPE}; {got}"


def test_dpne_entry_rejects_empty_users_and_bad_batches_and_accepts_good_ones():
    fn = ToTextBatchesFn(100)
    fn.start_bundle()
    list(fn.process(("", "a b")))
    with pytest.raises(E.InputElementError, match=r"got a \(user, text\) pair with an empty user$"):
        list(fn.finish_bundle())
    for bad, got in [
        (pa.table({"user": [S], "item": [S]}), "needs columns 'user' and 'text'"),
        (
            pa.table({"user": [S], "text": [None]}, schema=pa.schema([("user", pa.string()), ("text", pa.string())])),
            "column 'text' has null values",
        ),
        (pa.table({"user": [S], "text": pa.array([b"x"])}), "column 'text' is binary (must be string)"),
        (pa.table({"user": ["", "u"], "text": [S, S]}), "got a batch with an empty user"),
    ]:
        with pytest.raises(E.InputElementError, match=re.escape(got)):
            list(fn.process(bad))
    fn.start_bundle()
    good = [t for e in [(7, ""), ["u", "a b"]] for t in fn.process(e)] + [w.value for w in fn.finish_bundle()]
    assert sum(t.num_rows for t in good) == 2
    (batch,) = fn.process(pa.table({"user": pa.array([7]), "text": ["a b"]}))  # integer users: decimal text
    assert batch.column("user").to_pylist() == [b"7"]


def test_dpne_pipeline_rejects_dicts_with_the_message():
    lines = [json.dumps({"user": f"u{i}", "text": S}) for i in range(10)]
    with pytest.raises(Exception) as e:
        with make_test_pipeline() as p:
            _ = (
                p
                | beam.Create(lines)
                | beam.Map(json.loads)
                | DPNE("dpne", DPNEParams(epsilon=4, delta=1e-7, max_n=2), seed=1)
            )
    assert f"DPNE expects {E.DPNE_SHAPE}; got dict with keys ['user', 'text']" in str(e.value)
    assert S not in str(e.value)


PRIOR = BK.PublicPrior.from_counts({"a b": 3.0, "b c": 1.0})
BAYES = BayesianParams(n=2, epsilon=1.0, delta=1e-5, C=1, W=10)


@pytest.mark.parametrize(
    "bad, got",
    TEXT_BAD
    + [(("", S), "got tuple (str, str) whose user is an empty string"), (pa.table({"user": [S]}), "got Table")],
)
def test_bayesian_entry_rejects_bad_elements(bad, got):
    fn = UserNgramCountsFn(PRIOR, 2, tx.default_tokenize)
    fn.setup()
    assert list(fn.process(("u1", "a b c"))) == [(("u1", 0), 1), (("u1", 1), 1)]
    with pytest.raises(E.InputElementError) as e:
        list(fn.process(bad))
    assert str(e.value) == f"BayesianNgrams expects {E.BAYESIAN_SHAPE}; {got}"


def test_bayesian_pipeline_rejects_dicts_with_the_message():
    lines = [json.dumps({"user": f"u{i}", "text": S}) for i in range(10)]
    with pytest.raises(Exception) as e:
        with make_test_pipeline() as p:
            _ = (p | beam.Create(lines) | beam.Map(json.loads) | BayesianNgrams("laplace", PRIOR, BAYES, seed=1))[
                "info"
            ]
    assert f"BayesianNgrams expects {E.BAYESIAN_SHAPE}; got dict with keys ['user', 'text']" in str(e.value)
    assert S not in str(e.value)


# --- 2. the tokenizer's output ---------------------------------------------------------------------------

BAD_TOKENIZERS = [
    (bad_tok.returns_str, "returned str for a text segment; it must return a list of strings"),
    (bad_tok.returns_none, "returned NoneType for a text segment; it must return a list of strings"),
    (bad_tok.returns_ints, "returned a list holding int for a text segment; it must return a list of strings"),
    (
        bad_tok.returns_phrase,
        "returned an empty token or a token with whitespace for a text segment; it must return a list of "
        "non-empty strings without whitespace",
    ),
]


@pytest.mark.parametrize("fn, message", BAD_TOKENIZERS, ids=[f.__name__ for f, _ in BAD_TOKENIZERS])
def test_every_tokenizer_call_site_raises_tokenizer_error(fn, message):
    want = f"tokenizer tests.support.tokenizers_for_tests:{fn.__name__} {message}"
    text = f"{S} one two\nthree"
    calls = [
        lambda: tx.text_kgrams(text, 2, fn),
        lambda: tx.text_all_kgrams(text, 2, fn),
        lambda: CK.tokenize_table(CK.texts_table(["u"], [text]), fn),
        lambda: BK.text_ngram_counts(text, 2, fn),
    ]
    for call in calls:
        with pytest.raises(tx.TokenizerError) as e:
            call()
        assert str(e.value) == want and S not in str(e.value)


def test_checked_tokens_details():
    ok = tx.checked_tokens(["a", "b"], bad_tok.returns_str)
    assert ok == ["a", "b"] and tx.checked_tokens([], bad_tok.returns_str) == []
    assert tx.checked_tokens(("a", "b"), bad_tok.returns_tuple) == ("a", "b")  # tuples work like lists
    for bad in (["a", ""], ["a\tb"], ["a\u00a0b"], ["a", "b c"], [" "]):
        with pytest.raises(tx.TokenizerError, match="empty token or a token with whitespace"):
            tx.checked_tokens(bad, bad_tok.returns_str)
    assert tx.tokenizer_name(str.split) == "str.split"
    assert tx.text_kgrams("A b\nc", 1, bad_tok.returns_tuple) == {"a", "b", "c"}


def _private_jsonl(tmp_path):
    path = tmp_path / "texts.jsonl"
    rows = [{"user": f"u{i}", "text": f"{S} alpha beta\ngamma delta {i % 3}"} for i in range(30)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


# One CLI run for the error class (a TokenizerError becomes one ``error:`` line, exit 3): every bad tokenizer's
# message at every call site is checked by test_every_tokenizer_call_site_raises_tokenizer_error, and the CLI
# turns each into the same line (the message is the exception's text), so one tokenizer covers the CLI layer.
@pytest.mark.parametrize("fn, message", BAD_TOKENIZERS[:1], ids=[f.__name__ for f, _ in BAD_TOKENIZERS[:1]])
def test_extract_ngrams_cli_prints_one_line_for_a_bad_tokenizer(tmp_path, capfd, fn, message):
    argv = [
        "--input", _private_jsonl(tmp_path), "--input_format", "jsonl",
        "--output", str(tmp_path / "out" / "ngrams"), "--report", str(tmp_path / "out" / "report.json"),
        "--max_n", "2", "--epsilon", "4", "--delta", "1e-6", "--seed", "1",
        "--tokenizer", f"tests.support.tokenizers_for_tests:{fn.__name__}",
        "--direct_running_mode", "in_memory",
    ]  # fmt: skip
    code = extract_ngrams.run(argv)
    err = capfd.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 3, err
    assert errors == [f"error: tokenizer tests.support.tokenizers_for_tests:{fn.__name__} {message}"], err
    assert "Traceback" not in err and S not in err


# --- 3. the Bayesian report states its guarantee ---------------------------------------------------------

GUARANTEES = {
    "bayesian": ("worst-case (epsilon, delta)-DP", True, False),
    "bayesian_data_dependent": ("data-dependent", False, True),
    "laplace": ("worst-case (epsilon, delta)-DP", True, False),
    "laplace_public": ("data-dependent", False, True),
}


def run_bayesian_cli(tmp_path, name, *extra):
    """Runs the Bayesian CLI in-process on the small corpus of test_cli_bayesian; (exit code, lines, report)."""
    out, report = tmp_path / name / "probs", tmp_path / name / "report.json"
    argv = [
        "--private", write_private(tmp_path, "jsonl"), "--input_format", "jsonl",
        "--public", write_public(tmp_path), "--output", str(out), "--report", str(report),
        "--n", "2", "--C", "2", "--W", "6", "--direct_running_mode", "in_memory", *extra,
    ]  # fmt: skip
    code = bayesian_ngrams.run(argv)
    lines = [line for p in sorted(glob.glob(str(out) + "-*")) for line in open(p, encoding="utf-8")]
    return code, lines, json.loads(report.read_text()) if report.exists() else None


@pytest.mark.parametrize("mechanism", list(GUARANTEES))
def test_bayesian_report_guarantee_kind_private_flag_and_warning(tmp_path, capfd, mechanism):
    kind, private, warns = GUARANTEES[mechanism]
    gaussian = mechanism in ("bayesian", "bayesian_data_dependent")
    budget = ("--epsilon", "1", *(("--delta", "1e-5") if gaussian else ()))  # delta: the Gaussians'
    args = ("--mechanism", mechanism, *budget, *(("--acknowledge_data_dependent",) if warns else ()))
    code, lines, rep = run_bayesian_cli(tmp_path, "u", *args)  # unseeded
    captured = capfd.readouterr()
    assert code == 0 and len(lines) == CLI_PRIOR.size and rep["seed"] is None, captured.err
    assert rep["mechanism"] == mechanism and rep["guarantee_kind"] == kind and rep["private"] is private
    assert ("NOT a worst-case" in rep["guarantee"]) is warns
    warning = (
        f"warning: --mechanism {mechanism} calibrates its noise to a data-dependent sensitivity: NOT a "
        "worst-case (epsilon, delta)-DP guarantee, one outlier user can be detected (docs/bayesian_ngrams.md); "
        "the default --mechanism bayesian gives one"
    )
    assert (warning in captured.err.splitlines()) is warns, captured.err
    assert "warning: --mechanism" not in captured.err or warns
    summary = [line for line in captured.out.splitlines() if line.startswith("released")]
    assert len(summary) == 1 and ("NOT worst-case DP" in summary[0]) is warns  # the summary line states it too
    assert warns or ("worst-case" in summary[0] and "epsilon=1" in summary[0])
    if not warns:  # seeded: reproducible, so not private even with a worst-case guarantee
        code, _, rep = run_bayesian_cli(tmp_path, "s", *args, "--seed", "3")
        assert code == 0 and rep["private"] is False and rep["guarantee_kind"] == kind


def test_report_fields_match_every_mechanisms_release_info():
    """The launcher's table of sensitivities (for the warning, before the run) agrees with the release."""
    c = pa.array([30, 10]).to_numpy()
    for mechanism in bayesian_ngrams.SENSITIVITY:
        params = BAYES.replace(acknowledge_data_dependent=mechanism in DATA_DEPENDENT)
        _, info = BK.finalize(PRIOR, mechanism, params.replace(S=0.1, rho=0.5), c, c, [1.0], seed=1, rng=None)
        assert info["public"]["sensitivity"] == bayesian_ngrams.SENSITIVITY[mechanism]
        _, info = BK.finalize(
            PRIOR,
            mechanism,
            params,
            c,
            c,
            [1.0] * len(BAYES.S_values),
            1,
            None,
            choice_changes=[0.01] * len(BAYES.grid),
        )
        assert info["public"]["sensitivity"] == bayesian_ngrams.SENSITIVITY[mechanism]
        if mechanism == "bayesian_data_dependent":  # its private choice of S, rho (issue 33)
            gammas = [1.0] * len(BAYES.S_values)
            with pytest.raises(ValueError, match="choice_changes"):
                BK.finalize(PRIOR, mechanism, BAYES, c, c, gammas, seed=1, rng=None)
            changes = [0.01] * len(BAYES.grid)
            _, info = BK.finalize(PRIOR, mechanism, BAYES, c, c, gammas, seed=1, rng=None, choice_changes=changes)
            assert info["public"]["sensitivity"] == bayesian_ngrams.SENSITIVITY[mechanism]
        assert (bayesian_ngrams.data_dependent_warning(mechanism) is None) is (mechanism not in DATA_DEPENDENT)
