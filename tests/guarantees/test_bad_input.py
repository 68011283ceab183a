"""Bad input through the CLIs (issue 9, point 3): a clear error naming the record or parameter, or
documented handling (pipelines/io.py docstring, docs/guarantees.md "Bad input"); never a Beam stack trace or a
silent loss.

Exit codes: 2 = bad parameter (argparse, message names the parameter), 3 = bad input (message names
``FILE:LINE`` or the input pattern), 0 = handled as documented.
"""

import json
import os
import subprocess
import sys
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dp_partition_beam.pipelines import extract_ngrams, select_partitions
from dp_partition_beam.privacy.dpne import DPNEParams
from dp_partition_beam.privacy.selection import SelectionParams
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.core import randomness
from dp_partition_beam.transforms.dpne.reference import dpne_reference

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PARAMS = SelectionParams(2.0, 1e-4, max_contributions=8)


def _select(tmp_path, path, fmt="tsv", *extra, name="out"):
    out, rep = tmp_path / name / "items", tmp_path / name / "report.json"
    argv = [
        "--input",
        str(path),
        "--input_format",
        fmt,
        "--output",
        str(out),
        "--report",
        str(rep),
        "--epsilon",
        "2",
        "--delta",
        "1e-4",
        "--max_contributions",
        "8",
        "--direct_running_mode",
        "in_memory",
        *extra,
    ]
    code = select_partitions.run(argv)
    items = sorted(l.rstrip("\n") for p in sorted((tmp_path / name).glob("items*")) for l in open(p, encoding="utf-8"))
    return code, items


def _ngrams(tmp_path, path, fmt="jsonl", *extra):
    out, rep = tmp_path / "nout" / "ngrams", tmp_path / "nout" / "report.json"
    budget = [a for flag in ("--epsilon", "--delta") if flag not in extra for a in (flag, BUDGET[flag])]
    argv = [
        "--input",
        str(path),
        "--input_format",
        fmt,
        "--output",
        str(out),
        "--report",
        str(rep),
        "--max_n",
        "2",
        "--max_contributions",
        "5",
        *budget,
        "--direct_running_mode",
        "in_memory",
        *extra,
    ]
    return extract_ngrams.run(argv)


BUDGET = {"--epsilon": "4", "--delta": "1e-7"}  # required flags (each given once: extra may set them)


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


# --- empty input -----------------------------------------------------------------------------------


@pytest.mark.parametrize("content", ["", "user\titem\n", "\n\n  \n"], ids=["empty", "header-only", "blank-lines"])
def test_empty_input_fails_clearly(tmp_path, capsys, content):
    path = _write(tmp_path, "in.tsv", content)
    code, items = _select(tmp_path, path)
    err = capsys.readouterr().err
    assert code == 3 and items == []
    assert f"no records in {path}" in err and "Traceback" not in err


def test_empty_input_fails_clearly_for_ngrams(tmp_path, capsys):
    path = _write(tmp_path, "in.jsonl", "")
    assert _ngrams(tmp_path, path) == 3
    assert f"no records in {path}" in capsys.readouterr().err


def test_all_bad_records_skipped_is_empty_input(tmp_path, capsys):
    path = _write(tmp_path, "in.tsv", "no tab\nalso no tab\n")
    code, _ = _select(tmp_path, path, "tsv", "--skip_bad_records")
    assert code == 3 and "no records in" in capsys.readouterr().err


def test_input_errors_print_one_line_not_a_beam_stack_trace(tmp_path):
    path = _write(tmp_path, "in.tsv", "u1\ta\nu2\t   \n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dp_partition_beam.pipelines.select_partitions",
            "--input",
            str(path),
            "--input_format",
            "tsv",
            "--output",
            str(tmp_path / "o"),
            "--report",
            str(tmp_path / "r.json"),
            "--epsilon",
            "1",
            "--delta",
            "1e-5",
            "--direct_running_mode",
            "in_memory",
        ],
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


# --- malformed values ------------------------------------------------------------------------------


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
def test_malformed_tsv_values_name_file_and_line(tmp_path, capsys, data, line, reason):
    path = _write(tmp_path, "in.tsv", data)
    code, _ = _select(tmp_path, path)
    err = capsys.readouterr().err
    assert code == 3 and f"{path}:{line}: {reason}" in err


def test_items_are_opaque_not_trimmed(tmp_path):
    # Documented: " a" and "a" are different items (no normalisation), both kept.
    pairs = [(f"u{j}", " a") for j in range(40)] + [(f"u{j}", "a") for j in range(40)]
    path = _write(tmp_path, "in.tsv", "".join(f"{u}\t{i}\n" for u, i in pairs))
    code, items = _select(tmp_path, path, "tsv", "--seed", "3")
    assert code == 0 and items == [" a", "a"]


def test_non_utf8_text_for_ngrams_names_the_line(tmp_path, capsys):
    path = _write(tmp_path, "in.jsonl", b'{"user": "u", "text": "ok"}\n{"user": "v", "text": "\xc3("}\n')
    assert _ngrams(tmp_path, path) == 3
    assert f"{path}:2: not valid UTF-8" in capsys.readouterr().err


# --- very long items ---------------------------------------------------------------------------------


def test_item_longer_than_the_limit_is_a_bad_record(tmp_path, capsys):
    long_item = "x" * 10_001
    path = _write(tmp_path, "in.tsv", f"u1\ta\nu2\t{long_item}\n")
    code, _ = _select(tmp_path, path)
    err = capsys.readouterr().err
    assert code == 3 and f"{path}:2: value has 10001 characters, more than the limit 10000" in err
    assert "--max_item_length" in err and long_item not in err
    code, _ = _select(tmp_path, path, "tsv", "--max_item_length", "20000")
    assert code == 0


def test_huge_line_is_rejected_without_reading_it_whole(tmp_path, capsys):
    # A 3 MB line with --max_item_length 100: read in chunks of 12*100+4096 bytes, reported, skipped.
    path = _write(tmp_path, "in.tsv", "u1\t" + "y" * 3_000_000 + "\n" + "".join(f"u{j}\tb\n" for j in range(30)))
    code, _ = _select(tmp_path, path, "tsv", "--max_item_length", "100")
    assert code == 3 and f"{path}:1: line longer than 5296 bytes" in capsys.readouterr().err
    code, items = _select(tmp_path, path, "tsv", "--max_item_length", "100", "--skip_bad_records", "--seed", "1")
    assert code == 0 and items == ["b"]  # the following lines are read correctly


def test_text_longer_than_the_limit_for_ngrams(tmp_path, capsys):
    path = _write(tmp_path, "in.jsonl", json.dumps({"user": "u", "text": "w " * 600}) + "\n")
    assert _ngrams(tmp_path, path, "jsonl", "--max_text_length", "1000") == 3
    err = capsys.readouterr().err
    assert f"{path}:1: 'text': value has 1200 characters, more than the limit 1000" in err
    assert "--max_text_length" in err


# --- user ids, duplicates ----------------------------------------------------------------------------


def test_jsonl_integer_and_string_user_ids_are_the_same_user(tmp_path):
    # Documented: 1 and "1" are one user (the privacy-safe merge). With Delta_0 = 8 the merged user is
    # capped once; the seeded output equals the reference on the merged sets.
    lines = [{"user": 1, "item": f"i{j}"} for j in range(6)] + [{"user": "1", "item": f"i{j}"} for j in range(6, 12)]
    lines += [{"user": f"v{k}", "item": "i0"} for k in range(30)]
    path = _write(tmp_path, "in.jsonl", "".join(json.dumps(l) + "\n" for l in lines))
    code, items = _select(tmp_path, path, "jsonl", "--seed", "9")
    sets = reference.user_sets_from_pairs((str(l["user"]), l["item"]) for l in lines)
    assert len(sets["1"]) == 12
    assert code == 0 and set(items) == reference.select(sets, "basic", PARAMS, seed=9)


@pytest.mark.parametrize("user", [1.5, True, None, {"a": 1}, ""])
def test_jsonl_user_ids_of_other_types_are_bad_records(tmp_path, capsys, user):
    path = _write(
        tmp_path,
        "in.jsonl",
        json.dumps({"user": "ok", "item": "a"}) + "\n" + json.dumps({"user": user, "item": "a"}) + "\n",
    )
    code, _ = _select(tmp_path, path, "jsonl")
    assert code == 3 and f"{path}:2: 'user' must be a non-empty string or an integer" in capsys.readouterr().err


@pytest.mark.parametrize(
    "value, kind",
    [("1E2", "number"), ("3", "number"), ("1e400", "number"), ("true", "boolean"), ("null", "null")]
    + [('{"a": "b"}', "object"), ('["a"]', "array")],
)
def test_jsonl_items_must_be_json_strings(tmp_path, capsys, value, kind):
    # numbers are not read as their text (1E2 would become 100.0, 1e400 and Infinity one item "Infinity")
    path = _write(tmp_path, "in.jsonl", '{"user": "a", "item": "x"}\n{"user": "b", "item": ' + value + "}\n")
    code, items = _select(tmp_path, path, "jsonl")
    err = capsys.readouterr().err
    assert code == 3 and items == []
    assert f"{path}:2: 'item': value must be a JSON string, got {kind}" in err


def test_duplicated_lines_count_once(tmp_path):
    pairs = [(f"u{j % 25}", f"i{j % 7}") for j in range(100)]
    once = _write(tmp_path, "once.tsv", "".join(f"{u}\t{i}\n" for u, i in sorted(set(pairs))))
    twice = _write(tmp_path, "twice.tsv", "".join(f"{u}\t{i}\n{u}\t{i}\n" for u, i in pairs))
    a = _select(tmp_path, once, "tsv", "--seed", "2", name="once")
    b = _select(tmp_path, twice, "tsv", "--seed", "2", name="twice")
    want = reference.select(reference.user_sets_from_pairs(pairs), "mad_sips", PARAMS, seed=2)
    assert a == b == (0, sorted(want)) and want


# --- parquet ---------------------------------------------------------------------------------------


def test_parquet_with_missing_column_names_it(tmp_path, capsys):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"user": ["a", "b"], "word": ["x", "y"]}), path)
    code, _ = _select(tmp_path, path, "parquet")
    err = capsys.readouterr().err
    assert code == 3 and f"{path}: no column 'item' (columns: user, word)" in err
    assert _ngrams(tmp_path, path, "parquet") == 3
    assert "no column 'text'" in capsys.readouterr().err


def test_parquet_null_value_names_the_row(tmp_path, capsys):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"user": ["a", "b", "c"], "item": ["x", None, "z"]}), path)
    code, _ = _select(tmp_path, path, "parquet")
    assert code == 3 and f"{path}:row 2: 'item': null or boolean value" in capsys.readouterr().err


# --- a user with 10^6 items --------------------------------------------------------------------------


def test_user_with_a_million_items_is_bounded(tmp_path):
    # One user holds 10^6 distinct items; 60 others hold 'common'. The CLI caps the heavy user to
    # Delta_0 = 8 by streaming bottom-k (seeded output == reference) and finishes.
    n = 10**6
    path = tmp_path / "big.tsv"
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(f"heavy\ti{j}\n" for j in range(n)))
        f.write("".join(f"u{j}\tcommon\n" for j in range(60)))
    code, items = _select(tmp_path, path, "tsv", "--seed", "4")
    sets = {"heavy": (f"i{j}" for j in range(n))}
    sets.update({f"u{j}": ["common"] for j in range(60)})
    assert code == 0 and set(items) == reference.select(sets, "basic", PARAMS, seed=4)
    assert "common" in items


def test_bottom_k_subsample_streams_in_o_delta0_memory():
    # randomness.subsample (BoundContributions' kernel) over a generator of 2*10^5 items keeps O(k)
    # entries: peak traced allocation stays far below what a list of the items would take (~14 MB).
    items = (f"item-{j}" for j in range(2 * 10**5))
    rng = randomness.worker_rng()
    tracemalloc.start()
    out = randomness.subsample(items, 100, "heavy", 0, None, rng)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(out) == 100 and len(set(out)) == 100
    assert peak < 2_000_000, peak


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
    path = _write(tmp_path, "in.tsv", "u\ta\n")
    out = [
        "--input",
        str(path),
        "--input_format",
        "tsv",
        "--output",
        str(tmp_path / "o"),
        "--report",
        str(tmp_path / "r"),
    ]
    base = {"--epsilon": "1", "--delta": "1e-5"}
    base[flag] = value
    argv = out + [a for kv in base.items() for a in kv] + ["--direct_running_mode", "in_memory"]
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
    with pytest.raises(SystemExit) as e:
        _ngrams(tmp_path, path, "jsonl", flag, value, *(["--vk_method", "sample"] if flag == "--sample_rate" else []))
    assert e.value.code == 2
    assert name in capsys.readouterr().err


def test_ngrams_reference_agrees_on_good_input_after_bad_input_checks(tmp_path):
    # The bounded line reader does not change what is read: the CLI output equals the reference.
    recs = [(f"u{j}", "the quick brown fox") for j in range(40)]
    path = _write(tmp_path, "in.jsonl", "".join(json.dumps({"user": u, "text": t}) + "\n" for u, t in recs))
    assert _ngrams(tmp_path, path, "jsonl", "--seed", "5", "--epsilon", "4", "--delta", "1e-5") == 0
    got = sorted(l.rstrip("\n") for p in sorted((tmp_path / "nout").glob("ngrams*")) for l in open(p, encoding="utf-8"))
    want = dpne_reference(recs, "dpne", DPNEParams(epsilon=4, delta=1e-5, max_n=2, max_contributions=5), seed=5).lines()
    assert got == sorted(want) and got


# --- the bounded line reader -------------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dp_partition_beam.pipelines.io import read_lines  # noqa: E402


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
