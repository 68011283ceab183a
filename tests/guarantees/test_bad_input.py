"""Bad input (issue 9, point 3): a clear error naming the record or parameter, or documented handling
(pipelines/io.py docstring, docs/guarantees.md "Bad input"); never a Beam stack trace or a silent loss.

Each kind of bad record is checked at the layer that decides it: the reader each CLI builds for its
arguments (:class:`tests.support.cli.CliReader`: the CLI's parser, ``params_from_args`` and
``build_pipeline`` up to its ``ReadRecordBatches``, read in process, in ms), so a CLI that passed the
wrong columns, limits or TAB rule to its reader fails here. What only a CLI run can break, the mapping of
a documented error to exit 3, one ``error: ...`` line naming ``FILE:LINE`` and no output written, is
checked by one run per CLI (``--algorithm basic`` where the selection is not under test), a subprocess
for ``dp-select-partitions`` (as a user sees it). Runs that succeed check documented handling that
spans reader and selection (duplicates, opaque items, a user with 10^6 items) against the reference.

Exit codes: 2 = bad parameter (argparse, message names the parameter), 3 = bad input (message names
``FILE:LINE`` or the input pattern), 0 = handled as documented.
"""

import collections
import json
import os
import subprocess
import sys
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_partition_beam.pipelines import bayesian_ngrams, extract_ngrams, select_partitions
from dp_partition_beam.pipelines import io as pio
from dp_partition_beam.pipelines.io import read_lines
from dp_partition_beam.privacy.selection import SelectionParams
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.core import randomness

from tests.support.cli import CliReader, bayes_argv, ngrams_argv, released, run_fails, select_argv, snapshot

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# the budget of this file's selection runs (the reference's params for the seeded comparisons)
BUDGET = {"epsilon": 2, "delta": 1e-4, "max_contributions": 8}
PARAMS = SelectionParams(2.0, 1e-4, max_contributions=8)
SKIP_HINT = " (use --skip_bad_records to skip and count bad records)"


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def _with_flag(argv, flag, value):
    """``argv`` with ``flag`` set to ``value`` (its value replaced if given, else appended)."""
    if flag in argv:
        i = argv.index(flag)
        return [*argv[: i + 1], value, *argv[i + 2 :]]
    return [*argv, flag, value]


def _select_reader(tmp_path, path, fmt="tsv", *extra):
    return CliReader(select_partitions, select_argv(path, tmp_path / "out", *extra, fmt=fmt, **BUDGET))


def _ngrams_reader(tmp_path, path, fmt="jsonl", *extra):
    return CliReader(extract_ngrams, ngrams_argv(path, tmp_path / "out", *extra, fmt=fmt))


# --- empty input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("content", ["", "user\titem\n", "\n\n  \n"], ids=["empty", "header-only", "blank-lines"])
def test_empty_input_reads_no_record(tmp_path, content):
    # The select CLI's reader reads nothing from these files; FailIfEmpty's check then fails on 0 records
    # (the CLI run of that error: test_all_bad_records_skipped_is_empty_input).
    path = _write(tmp_path, "in.tsv", content)
    assert _select_reader(tmp_path, path).read() == (collections.Counter(), 0)
    with pytest.raises(pio.EmptyInputError) as e:
        pio.check_not_empty(0, str(path))
    assert str(e.value).startswith(f"input: no records in {path} ")
    assert pio.check_not_empty(1, str(path)) == 1


def test_all_bad_records_skipped_is_empty_input(tmp_path, capsys):
    # The CLI run of "no record" (EmptyInputError from FailIfEmpty): --skip_bad_records reaches the reader,
    # which skips both lines, and the run stops with one line and writes nothing. The other CLIs' runs of
    # this error: tests/pipelines/test_cli_common.py::test_empty_private_input_fails_alike_without_traceback.
    path = _write(tmp_path, "in.tsv", "no tab\nalso no tab\n")
    assert _select_reader(tmp_path, path, "tsv", "--skip_bad_records").read() == (collections.Counter(), 2)
    message = f"input: no records in {path} (the files are empty or hold only headers/blank lines or only bad records)"
    argv = select_argv(path, tmp_path / "out", "--skip_bad_records", **BUDGET)
    run_fails(capsys, tmp_path, select_partitions.run, argv, message)


def test_no_input_file_fails_the_ngram_clis_with_one_line(tmp_path, capsys):
    # "no file matches" through the n-gram CLIs (Beam's empty match, mapped to one line, exit 3); the
    # select CLI's run: tests/pipelines/test_output_contract.py::test_missing_input_is_one_line_and_leaves_no_directory
    pattern = tmp_path / "nowhere" / "*.jsonl"
    message = f"input: no file matches {pattern}"
    run_fails(capsys, tmp_path, extract_ngrams.run, ngrams_argv(pattern, tmp_path / "out"), message)
    public = _write(tmp_path, "public.tsv", "ok ok\t1\n")
    run_fails(capsys, tmp_path, bayesian_ngrams.run, bayes_argv(pattern, public, tmp_path / "out"), message)


# --- a bad record through each CLI --------------------------------------------------------------------


def test_input_errors_print_one_line_not_a_beam_stack_trace(tmp_path):
    # dp-select-partitions as a user runs it: exit 3, the last line names FILE:LINE, no traceback or Beam
    # ERROR record, and no output file (nor its directory) left behind.
    path = _write(tmp_path, "in.tsv", "u1\ta\nu2\t   \n")
    before = snapshot(tmp_path)
    argv = select_argv(path, tmp_path / "out", epsilon=1, delta=1e-5, max_contributions=None)
    proc = subprocess.run(
        [sys.executable, "-m", "dp_partition_beam.pipelines.select_partitions", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 3
    assert f"error: bad input record: {path}:2: value is only whitespace" in proc.stderr
    # No stack trace and no Beam-internal error record (INFO chatter of the runner may appear).
    assert "Traceback" not in proc.stderr and "ERROR" not in proc.stderr, proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1].startswith("error: bad input record:")
    assert snapshot(tmp_path) == before and not (tmp_path / "out").exists()


def test_bad_record_in_ngrams_and_bayesian_runs_is_one_line(tmp_path, capsys):
    # The n-gram CLIs' runs of BadRecordError: exit 3, exactly the record's FILE:LINE line, nothing written.
    path = _write(tmp_path, "in.jsonl", b'{"user": "u", "text": "ok"}\n{"user": "v", "text": "\xc3("}\n')
    reason = _ngrams_reader(tmp_path, path).error()
    assert reason.startswith(f"{path}:2: not valid UTF-8") and reason.endswith(SKIP_HINT)
    run_fails(capsys, tmp_path, extract_ngrams.run, ngrams_argv(path, tmp_path / "out"), "bad input record: " + reason)
    public = _write(tmp_path, "public.tsv", "ok ok\t1\n")
    assert CliReader(bayesian_ngrams, bayes_argv(path, public, tmp_path / "out")).error() == reason
    argv = bayes_argv(path, public, tmp_path / "out")
    run_fails(capsys, tmp_path, bayesian_ngrams.run, argv, "bad input record: " + reason)


# --- malformed values (the select CLI's reader) ------------------------------------------------------


@pytest.mark.parametrize(
    "data,line,reason",
    [
        (b"u1\ta\nu2\t\n", 2, "empty value"),
        (b"u1\ta\nu2\t \t \n", 2, "value is only whitespace"),
        (b"u1\ta\nu2\tb\xff\xfec\n", 2, "not valid UTF-8"),
        (b"u1\ta\n\tb\n", 2, "empty user"),
        (b"u1\ta\nu2\tb\tc\n", 2, "value contains a TAB (outputs are item<TAB>count)"),
        (b"user\tthing\nu1\ta\n", 1, "header 'user<TAB>thing' does not name the expected columns 'user<TAB>item'"),
    ],
    ids=["empty-item", "whitespace-item", "non-utf8", "empty-user", "tab-in-item", "header-other-names"],
)
def test_malformed_tsv_values_name_file_and_line(tmp_path, data, line, reason):
    path = _write(tmp_path, "in.tsv", data)
    message = _select_reader(tmp_path, path).error()
    assert message.startswith(f"{path}:{line}: {reason}") and message.endswith(SKIP_HINT)


# --- very long items -----------------------------------------------------------------------------------


def test_item_longer_than_the_limit_is_a_bad_record(tmp_path):
    # --max_item_length reaches the select CLI's reader: over it a bad record (naming the flag, not
    # showing the item), raised it reads both records.
    long_item = "x" * 10_001
    path = _write(tmp_path, "in.tsv", f"u1\ta\nu2\t{long_item}\n")
    message = _select_reader(tmp_path, path).error()
    assert message.startswith(f"{path}:2: value has 10001 characters, more than the limit 10000")
    assert "--max_item_length" in message and long_item not in message
    records, bad = _select_reader(tmp_path, path, "tsv", "--max_item_length", "20000").read()
    assert bad == 0 and records == collections.Counter({("u1", "a"): 1, ("u2", long_item): 1})


def test_huge_line_is_rejected_without_reading_it_whole(tmp_path):
    # A 3 MB line with --max_item_length 100: read in chunks of 12*100+4096 bytes, reported, skipped.
    path = _write(tmp_path, "in.tsv", "u1\t" + "y" * 3_000_000 + "\n" + "".join(f"u{j}\tb\n" for j in range(30)))
    message = _select_reader(tmp_path, path, "tsv", "--max_item_length", "100").error()
    assert message.startswith(f"{path}:1: line longer than 5296 bytes")
    records, bad = _select_reader(tmp_path, path, "tsv", "--max_item_length", "100", "--skip_bad_records").read()
    assert bad == 1 and records == collections.Counter({(f"u{j}", "b"): 1 for j in range(30)})  # read correctly


def test_text_longer_than_the_limit_for_ngrams(tmp_path):
    path = _write(tmp_path, "in.jsonl", json.dumps({"user": "u", "text": "w " * 600}) + "\n")
    message = _ngrams_reader(tmp_path, path, "jsonl", "--max_text_length", "1000").error()
    assert message.startswith(f"{path}:1: 'text': value has 1200 characters, more than the limit 1000")
    assert "--max_text_length" in message
    assert _ngrams_reader(tmp_path, path).read() == (collections.Counter({("u", "w " * 600): 1}), 0)


# --- user ids, duplicates, opaque items ----------------------------------------------------------------


def test_jsonl_integer_and_string_user_ids_are_the_same_user(tmp_path):
    # Documented: 1 and "1" are one user (the privacy-safe merge): the reader gives both the user "1".
    lines = [{"user": 1, "item": f"i{j}"} for j in range(6)] + [{"user": "1", "item": f"i{j}"} for j in range(6, 12)]
    lines += [{"user": f"v{k}", "item": "i0"} for k in range(30)]
    path = _write(tmp_path, "in.jsonl", "".join(json.dumps(l) + "\n" for l in lines))
    records, bad = _select_reader(tmp_path, path, "jsonl").read()
    assert bad == 0 and records == collections.Counter((str(l["user"]), l["item"]) for l in lines)
    assert sum(1 for user, _ in records if user == "1") == 12


@pytest.mark.parametrize("user", [1.5, True, None, {"a": 1}, ""])
def test_jsonl_user_ids_of_other_types_are_bad_records(tmp_path, user):
    path = _write(
        tmp_path,
        "in.jsonl",
        json.dumps({"user": "ok", "item": "a"}) + "\n" + json.dumps({"user": user, "item": "a"}) + "\n",
    )
    message = _select_reader(tmp_path, path, "jsonl").error()
    assert message.startswith(f"{path}:2: 'user' must be a non-empty string or an integer")


@pytest.mark.parametrize(
    "value, kind",
    [("1E2", "number"), ("3", "number"), ("1e400", "number"), ("true", "boolean"), ("null", "null")]
    + [('{"a": "b"}', "object"), ('["a"]', "array")],
)
def test_jsonl_items_must_be_json_strings(tmp_path, value, kind):
    # numbers are not read as their text (1E2 would become 100.0, 1e400 and Infinity one item "Infinity")
    path = _write(tmp_path, "in.jsonl", '{"user": "a", "item": "x"}\n{"user": "b", "item": ' + value + "}\n")
    message = _select_reader(tmp_path, path, "jsonl").error()
    assert message.startswith(f"{path}:2: 'item': value must be a JSON string, got {kind}")


def test_duplicated_lines_count_once_and_items_are_opaque(tmp_path):
    # A CLI run: every line twice, and the items " a" and "a" (no trimming: two items). The reader passes
    # both on; the seeded release equals the reference on the DISTINCT pairs (a repeated pair counted
    # twice would change the weights) and holds " a" and "a" apart.
    pairs = [(f"u{j % 25}", f"i{j % 7}") for j in range(100)]
    pairs += [(f"u{j}", " a") for j in range(40)] + [(f"u{j}", "a") for j in range(40)]
    path = _write(tmp_path, "twice.tsv", "".join(f"{u}\t{i}\n{u}\t{i}\n" for u, i in pairs))
    records, _ = _select_reader(tmp_path, path).read()
    assert records[("u0", " a")] == records[("u0", "a")] == 2
    assert select_partitions.run(select_argv(path, tmp_path / "out", "--seed", "2", **BUDGET)) == 0
    want = reference.select(reference.user_sets_from_pairs(pairs), "basic", PARAMS, seed=2)
    assert released(tmp_path / "out", "items") == sorted(want) and {" a", "a"} <= want


# --- parquet -----------------------------------------------------------------------------------------


def test_parquet_with_missing_column_names_it(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"user": ["a", "b"], "word": ["x", "y"]}), path)
    assert (
        _select_reader(tmp_path, path, "parquet").error().startswith(f"{path}: no column 'item' (columns: user, word)")
    )
    assert (
        _ngrams_reader(tmp_path, path, "parquet").error().startswith(f"{path}: no column 'text' (columns: user, word)")
    )


def test_parquet_null_value_names_the_row(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"user": ["a", "b", "c"], "item": ["x", None, "z"]}), path)
    assert _select_reader(tmp_path, path, "parquet").error().startswith(f"{path}:row 2: 'item': null or boolean value")


# --- a user with 10^5 items --------------------------------------------------------------------------


def test_user_with_a_hundred_thousand_items_is_bounded(tmp_path):
    # One user holds 10^5 distinct items; 60 others hold 'common'. The CLI caps the heavy user to
    # Delta_0 = 8 by bottom-k (seeded output == reference) and finishes. 10^5 (not 10^6): the equality
    # with the reference does not depend on the size, and the O(Delta_0) memory of the streaming kernel
    # is checked directly by the tracemalloc test below; 10^6 cost ~9 CPU-s of pure line writing/reading.
    n = 10**5
    path = tmp_path / "big.tsv"
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(f"heavy\ti{j}\n" for j in range(n)))
        f.write("".join(f"u{j}\tcommon\n" for j in range(60)))
    assert select_partitions.run(select_argv(path, tmp_path / "out", "--seed", "4", **BUDGET)) == 0
    sets = {"heavy": (f"i{j}" for j in range(n))}
    sets.update({f"u{j}": ["common"] for j in range(60)})
    items = released(tmp_path / "out", "items")
    assert set(items) == reference.select(sets, "basic", PARAMS, seed=4)
    assert "common" in items


def test_bottom_k_subsample_streams_in_o_delta0_memory():
    # randomness.subsample (BoundContributions' kernel) over a generator of 2*10^4 items keeps O(k)
    # entries: its peak traced allocation (~60 KB measured) stays far below what a list, set or dict of
    # the items would take (~1.4 MB for a list). 2*10^4 (not 2*10^5) because tracemalloc slows every
    # allocation: the bound 400 KB still sits >6x above the streaming peak and >3x below a materialised list.
    items = (f"item-{j}" for j in range(2 * 10**4))
    rng = randomness.worker_rng()
    tracemalloc.start()
    out = randomness.subsample(items, 100, "heavy", 0, None, rng)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(out) == 100 and len(set(out)) == 100
    assert peak < 400_000, peak


# --- parameters --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flag,value,name",
    [
        ("--epsilon", "nan", "epsilon"),
        ("--epsilon", "inf", "epsilon"),
        ("--epsilon", "-0.5", "epsilon"),
        ("--epsilon", "0", "epsilon"),
        ("--epsilon", "101", "epsilon"),
        ("--delta", "nan", "delta"),
        ("--delta", "0", "delta"),
        ("--delta", "1", "delta"),
        ("--delta", "-1e-5", "delta"),
        ("--delta", "inf", "delta"),
        ("--max_contributions", "0", "max_contributions"),
        ("--max_contributions", "-3", "max_contributions"),
        ("--max_contributions", "100000000", "max_contributions"),
        ("--max_contributions", "1e3", "max_contributions"),
        ("--beta", "-1", "beta"),
        ("--beta", "nan", "beta"),
        ("--c_ub", "inf", "c_ub"),
        ("--b_max", "nan", "b_max"),
        ("--budget_split", "nan,0.5", "budget_split"),
        ("--max_item_length", "0", "max_item_length"),
    ],
)
def test_bad_selection_parameters_exit_2_naming_them(tmp_path, capsys, flag, value, name):
    # the algorithm's default (mad_sips), which reads every flag above
    path = _write(tmp_path, "in.tsv", "u\ta\n")
    argv = _with_flag(
        select_argv(path, tmp_path / "o", algorithm=None, epsilon=1, delta=1e-5, max_contributions=None), flag, value
    )
    with pytest.raises(SystemExit) as e:
        select_partitions.run(argv)
    assert e.value.code == 2
    assert name in capsys.readouterr().err
    assert not list(tmp_path.glob("o*"))  # nothing ran


@pytest.mark.parametrize(
    "flag,value,name",
    [
        ("--epsilon", "nan", "epsilon"),
        ("--delta", "2", "delta"),
        ("--eta", "nan", "eta"),
        ("--eta", "1", "eta"),
        ("--sigma_decay", "inf", "sigma_decay"),
        ("--max_n", "0", "max_n"),
        ("--max_contributions", "0", "max_contributions"),
        ("--max_contributions", "3,4,5", "max_contributions"),
        ("--sample_rate", "-1", "sample_rate"),
        ("--max_text_length", "-5", "max_text_length"),
    ],
)
def test_bad_ngram_parameters_exit_2_naming_them(tmp_path, capsys, flag, value, name):
    path = _write(tmp_path, "in.jsonl", '{"user": "u", "text": "a b"}\n')
    extra = ["--vk_method", "sample"] if flag == "--sample_rate" else []
    argv = _with_flag(ngrams_argv(path, tmp_path / "nout", *extra, delta=1e-7), flag, value)
    with pytest.raises(SystemExit) as e:
        extract_ngrams.run(argv)
    assert e.value.code == 2
    assert name in capsys.readouterr().err


def test_ngrams_reader_reads_good_input_unchanged(tmp_path):
    # The bounded line reader does not change what is read: the n-gram CLI's reader gives the records.
    recs = [(f"u{j}", "the quick brown fox") for j in range(40)] + [("u0", "a\tb  c"), (7, "seven")]
    path = _write(tmp_path, "in.jsonl", "".join(json.dumps({"user": u, "text": t}) + "\n" for u, t in recs))
    assert _ngrams_reader(tmp_path, path).read() == (collections.Counter((str(u), t) for u, t in recs), 0)


# --- the bounded line reader -------------------------------------------------------------------------


class _Stream:
    def __init__(self, data):
        self._data, self._pos = data, 0

    def read(self, n):
        out = self._data[self._pos : self._pos + n]
        self._pos += n
        return out


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=12),
    st.booleans(),
    st.integers(1, 7),
    st.integers(1, 40),
)
def test_read_lines_equals_splitting_with_overlong_marked(lines, final_newline, chunk, cap):
    data = b"\n".join(lines) + (b"\n" if final_newline and lines else b"")
    got = list(read_lines(_Stream(data), cap, chunk_size=chunk))
    want = []
    for i, line in enumerate(data.split(b"\n")):
        is_last = i == len(data.split(b"\n")) - 1
        if is_last and line == b"":
            break
        full = line if is_last else line + b"\n"
        want.append((b"", True) if len(full) > cap else (full, False))
    assert got == want
