"""Every reader verifies its file (issue 27, points 2, 8 and the readers of 9).

Readers: the private input (tsv, jsonl; ``select_partitions`` and ``extract_ngrams``), the
allowlist (``--allowlist``) and the Bayesian public counts (``--public``). A truncated compressed
file, a corrupt one (bad CRC), an uncompressed file with a compressed name, a directory, a missing,
empty, binary or non-UTF-8 allowlist, a non-parquet file read as parquet: exit 3 with one
``error: ...`` line naming the file, no traceback, no file written or changed. Plus the record rules
of the same issue: TAB in an item, jsonl numbers as items, a tsv header with other column names,
and a UTF-8 BOM at the start of every kind of file.
"""

import bz2
import gzip
import json
import lzma
import os
import zlib

import apache_beam as beam
import pytest
import zstandard
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dp_partition_beam.pipelines import bayesian_ngrams, extract_ngrams, select_partitions
from dp_partition_beam.pipelines import io as pio
from dp_partition_beam.privacy.dpne import DPNEParams
from dp_partition_beam.privacy.selection import SelectionParams
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.dpne.reference import dpne_reference

PARAMS = SelectionParams(5.0, 1e-4, max_contributions=4)
# 300 users: item j (j < 6) is held by 300 - 40 j users (far above the threshold), t0/t1 by one user
PAIRS = [(f"u{u}", f"i{j}") for u in range(300) for j in range(6) if u < 300 - 40 * j]
PAIRS += [("u0", "t0"), ("u1", "t1")]
TEXTS = [(f"u{u}", f"w{u % 3} w{(u + 1) % 3} end") for u in range(120)]
# the Bayesian public vocabulary (bigrams over w0..w4)
VOCAB = [f"w{a} w{b}" for a in range(5) for b in range(5)]


# --- files -----------------------------------------------------------------------------------------


def tsv_bytes(pairs=PAIRS) -> bytes:
    return "".join(f"{u}\t{i}\n" for u, i in pairs).encode()


def jsonl_bytes(rows, value="item") -> bytes:
    return "".join(json.dumps({"user": u, value: v}) + "\n" for u, v in rows).encode()


def public_bytes() -> bytes:
    return "".join(f"{g}\t{k + 1}\n" for k, g in enumerate(VOCAB)).encode()


def allowlist_bytes() -> bytes:
    return b"i0\ni2\ni4\nt0\n"


def bad_crc_gzip(data: bytes) -> bytes:
    blob = bytearray(gzip.compress(data))
    blob[-8] ^= 0xFF  # the member trailer: CRC-32 (4 bytes), then ISIZE (4 bytes)
    return bytes(blob)


# damaged kind -> (file suffix, bytes from the good content, the one-line message after "PATH: ")
DAMAGED = {
    "truncated-gz": (
        ".gz",
        lambda d: gzip.compress(d)[: len(gzip.compress(d)) // 2],
        "truncated gzip stream (the file ends before its end-of-stream marker; a partial copy?)",
    ),
    "truncated-bz2": (
        ".bz2",
        lambda d: bz2.compress(d)[: len(bz2.compress(d)) // 2],
        "truncated bzip2 stream (the file ends before its end-of-stream marker; a partial copy?)",
    ),
    "bad-crc-gz": (".gz", bad_crc_gzip, "corrupt gzip data (Error -3 while decompressing data: incorrect data check)"),
    "plain-text-named-gz": (
        ".gz",
        lambda d: d,
        "not a valid gzip file (it does not start with the gzip magic bytes; an uncompressed file named *.gz?)",
    ),
}


def snapshot(root):
    """path -> (size, mtime) of every file under ``root``."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            st_ = os.stat(path)
            out[path] = (st_.st_size, st_.st_mtime_ns)
    return out


# --- the CLIs ----------------------------------------------------------------------------------------


def select_argv(tmp_path, input_path, fmt="tsv", *extra, name="out"):
    out = tmp_path / name
    return [
        "--input",
        str(input_path),
        "--input_format",
        fmt,
        "--output",
        str(out / "items"),
        "--report",
        str(out / "report.json"),
        "--algorithm",
        "basic",
        "--epsilon",
        "5",
        "--delta",
        "1e-4",
        "--max_contributions",
        "4",
        "--direct_running_mode",
        "in_memory",
        "--progress_interval",
        "0",
        *map(str, extra),
    ]


def ngrams_argv(tmp_path, input_path, fmt="jsonl", *extra, name="out"):
    out = tmp_path / name
    return [
        "--input",
        str(input_path),
        "--input_format",
        fmt,
        "--output",
        str(out / "ngrams"),
        "--report",
        str(out / "report.json"),
        "--epsilon",
        "4",
        "--delta",
        "1e-5",
        "--max_n",
        "2",
        "--max_contributions",
        "5",
        "--direct_running_mode",
        "in_memory",
        "--progress_interval",
        "0",
        *map(str, extra),
    ]


def bayes_argv(tmp_path, private, public, *extra, name="out"):
    out = tmp_path / name
    return [
        "--private",
        str(private),
        "--input_format",
        "jsonl",
        "--public",
        str(public),
        "--output",
        str(out / "probs"),
        "--report",
        str(out / "report.json"),
        "--n",
        "2",
        "--mechanism",
        "laplace",
        "--epsilon",
        "2",
        "--direct_running_mode",
        "in_memory",
        "--progress_interval",
        "0",
        *map(str, extra),
    ]


def released(tmp_path, prefix, name="out"):
    return sorted(
        line.rstrip("\n") for p in sorted((tmp_path / name).glob(prefix + "*")) for line in open(p, encoding="utf-8")
    )


def run_fails(capsys, tmp_path, run, argv, message):
    """Runs a CLI that must fail on its input: exit 3, exactly ``error: message`` as its error line,
    no traceback, and no file under ``tmp_path`` written or changed."""
    before = snapshot(tmp_path)
    code = run(argv)
    err = capsys.readouterr().err
    assert code == 3, err
    assert [line for line in err.splitlines() if line.startswith("error")] == [f"error: {message}"], err
    assert "Traceback" not in err and "ERROR" not in err, err
    assert snapshot(tmp_path) == before


def _write(tmp_path, name, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


# Each reader: (the good content, the file's name, (tmp_path, path of the file) -> (run, argv), the
# prefix of the released files). The other files a run needs are written intact.
READERS = {
    "select-tsv": (tsv_bytes, "in.tsv", lambda t, p: (select_partitions.run, select_argv(t, p, "tsv")), "items"),
    "select-jsonl": (
        lambda: jsonl_bytes(PAIRS),
        "in.jsonl",
        lambda t, p: (select_partitions.run, select_argv(t, p, "jsonl")),
        "items",
    ),
    "ngrams-jsonl": (
        lambda: jsonl_bytes(TEXTS, "text"),
        "in.jsonl",
        lambda t, p: (extract_ngrams.run, ngrams_argv(t, p, "jsonl")),
        "ngrams",
    ),
    "ngrams-tsv": (
        lambda: tsv_bytes(TEXTS),
        "in.tsv",
        lambda t, p: (extract_ngrams.run, ngrams_argv(t, p, "tsv")),
        "ngrams",
    ),
    "allowlist": (
        allowlist_bytes,
        "allow.txt",
        lambda t, p: (select_partitions.run, select_argv(t, _write(t, "in.tsv", tsv_bytes()), "tsv", "--allowlist", p)),
        "items",
    ),
    "ngrams-allowlist": (
        lambda: b"w0 w1\nw1\nw2 w0\n",
        "allow.txt",
        lambda t, p: (
            extract_ngrams.run,
            ngrams_argv(t, _write(t, "in.jsonl", jsonl_bytes(TEXTS, "text")), "jsonl", "--allowlist", p),
        ),
        "ngrams",
    ),
    "public": (
        public_bytes,
        "public.tsv",
        lambda t, p: (bayesian_ngrams.run, bayes_argv(t, _write(t, "in.jsonl", jsonl_bytes(TEXTS, "text")), p)),
        "probs",
    ),
}


@pytest.mark.parametrize("damage", sorted(DAMAGED))
@pytest.mark.parametrize("reader", sorted(READERS))
def test_damaged_compressed_file_fails_with_one_line_naming_it(tmp_path, capsys, reader, damage):
    content, name, make, _ = READERS[reader]
    suffix, spoil, message = DAMAGED[damage]
    path = _write(tmp_path, name + suffix, spoil(content()))
    run, argv = make(tmp_path, path)
    run_fails(capsys, tmp_path, run, argv, f"{path}: {message}")


@pytest.mark.parametrize("reader", sorted(READERS))
def test_intact_compressed_files_read_as_the_uncompressed_one(tmp_path, capsys, reader):
    # a multi-member gzip (three members, as `cat a.gz b.gz c.gz` makes) gives the release of the
    # uncompressed file under the same seed (other formats and concatenations: the open_input tests)
    content, name, make, prefix = READERS[reader]
    data = content()
    lines = data.splitlines(keepends=True)
    cut = [0, len(lines) // 3, 2 * len(lines) // 3, len(lines)]
    thirds = [b"".join(lines[a:b]) for a, b in zip(cut, cut[1:])]
    files = {"plain": data, "multi.gz": b"".join(gzip.compress(part) for part in thirds)}
    results = {}
    for kind, blob in files.items():
        sub = tmp_path / kind.replace(".", "-")
        sub.mkdir()
        path = _write(sub, name + ("" if kind == "plain" else "." + kind.split(".")[-1]), blob)
        run, argv = make(sub, path)
        assert run([*argv, "--seed", "3"]) == 0, capsys.readouterr().err
        results[kind] = released(sub, prefix)
    assert results["plain"] and results["plain"] == results["multi.gz"]


def test_intact_multi_member_gzip_input_equals_the_reference(tmp_path):
    members = [tsv_bytes(PAIRS[k::4]) for k in range(4)]
    path = _write(tmp_path, "in.tsv.gz", b"".join(gzip.compress(m) for m in members))
    assert select_partitions.run(select_argv(tmp_path, path, "tsv", "--seed", "11")) == 0
    want = reference.select(reference.user_sets_from_pairs(PAIRS), "basic", PARAMS, seed=11)
    got = [line for line in released(tmp_path, "items")]
    assert sorted(want) == got and {"i0", "i1"} <= set(got)


# --- directories, missing and empty files ------------------------------------------------------------


def _directory_message(path):
    return f"{path} is a directory, not a file (give a file, or a glob of files such as {path}/*)"


def test_a_directory_as_input_allowlist_or_public_fails_with_one_line(tmp_path, capsys):
    d = tmp_path / "adir"
    d.mkdir()
    (d / "f.tsv").write_bytes(tsv_bytes())
    good_tsv = _write(tmp_path, "in.tsv", tsv_bytes())
    good_jsonl = _write(tmp_path, "in.jsonl", jsonl_bytes(TEXTS, "text"))
    message = _directory_message(d)
    run_fails(capsys, tmp_path, select_partitions.run, select_argv(tmp_path, d), message)
    run_fails(capsys, tmp_path, select_partitions.run, select_argv(tmp_path, d, "parquet"), message)
    run_fails(capsys, tmp_path, extract_ngrams.run, ngrams_argv(tmp_path, d, "jsonl"), message)
    run_fails(
        capsys, tmp_path, select_partitions.run, select_argv(tmp_path, good_tsv, "tsv", "--allowlist", str(d)), message
    )
    run_fails(capsys, tmp_path, bayesian_ngrams.run, bayes_argv(tmp_path, good_jsonl, d), message)
    with pytest.raises(pio.InputFileError, match="is a directory"):
        pio.load_public_counts(str(d), 2)


def test_missing_allowlist_names_the_allowlist(tmp_path, capsys):
    path = _write(tmp_path, "in.tsv", tsv_bytes())
    missing = tmp_path / "nope.txt"
    argv = select_argv(tmp_path, path, "tsv", "--allowlist", str(missing))
    run_fails(capsys, tmp_path, select_partitions.run, argv, f"allowlist: no file matches {missing}")


@pytest.mark.parametrize("content", [b"", b"\n\n\r\n", b"\xef\xbb\xbf\n"], ids=["empty", "blank-lines", "bom-only"])
def test_empty_allowlist_is_an_error(tmp_path, capsys, content):
    path = _write(tmp_path, "in.tsv", tsv_bytes())
    allow = _write(tmp_path, "allow.txt", content)
    message = (
        f"allowlist: no entries in {allow} (the files are empty or hold only blank lines; an empty allowlist "
        "would release nothing)"
    )
    run_fails(
        capsys, tmp_path, select_partitions.run, select_argv(tmp_path, path, "tsv", "--allowlist", str(allow)), message
    )
    texts = _write(tmp_path, "in.jsonl", jsonl_bytes(TEXTS, "text"))
    argv = ngrams_argv(tmp_path, texts, "jsonl", "--allowlist", str(allow))
    run_fails(capsys, tmp_path, extract_ngrams.run, argv, message)


@pytest.mark.parametrize(
    "content, line, reason",
    [
        (b"i0\ni1\x00\x01\x02\n", 2, "binary data (a NUL byte; an allowlist is UTF-8 text, one item per line)"),
        (b"\xff\xfei0\n", 1, "not valid UTF-8 (invalid start byte at byte 0)"),
        (b"i0\ni\xc3(\n", 2, "not valid UTF-8 (invalid continuation byte at byte 1)"),
    ],
    ids=["nul", "utf16-bom", "bad-continuation"],
)
def test_binary_or_non_utf8_allowlist_names_the_line(tmp_path, capsys, content, line, reason):
    path = _write(tmp_path, "in.tsv", tsv_bytes())
    allow = _write(tmp_path, "allow.txt", content)
    argv = select_argv(tmp_path, path, "tsv", "--allowlist", str(allow))
    run_fails(capsys, tmp_path, select_partitions.run, argv, f"{allow}:{line}: {reason}")


def test_file_that_is_not_parquet_fails_with_one_line(tmp_path, capsys):
    path = _write(tmp_path, "in.parquet", tsv_bytes())
    before = snapshot(tmp_path)
    assert select_partitions.run(select_argv(tmp_path, path, "parquet")) == 3
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {path}: not a parquet file (")
    assert "magic bytes" in errors[0] and "Traceback" not in err and snapshot(tmp_path) == before
    assert extract_ngrams.run(ngrams_argv(tmp_path, path, "parquet")) == 3
    assert f"error: {path}: not a parquet file (" in capsys.readouterr().err


# --- BOM, CRLF ----------------------------------------------------------------------------------------


def test_allowlist_entries_strip_bom_and_crlf_in_a_pipeline(tmp_path):
    a = _write(tmp_path, "a.txt", b"\xef\xbb\xbfi0\r\ni1\r\n\r\n \r\n")
    b = _write(tmp_path, "b.txt.gz", gzip.compress(b"\xef\xbb\xbfi2\ni\xc3\xa9\n"))
    with beam.Pipeline() as p:
        assert_that(pio.read_allowlist(p, str(tmp_path / "*.tx*")), equal_to(["i0", "i1", " ", "i2", "ié"]))
    assert list(pio.allowlist_entries(str(a))) == ["i0", "i1", " "]
    assert list(pio.allowlist_entries(str(b))) == ["i2", "ié"]


def test_allowlist_with_a_bom_releases_its_first_entry(tmp_path):
    path = _write(tmp_path, "in.tsv", tsv_bytes())
    allow = _write(tmp_path, "allow.txt", b"\xef\xbb\xbf" + allowlist_bytes().replace(b"\n", b"\r\n"))
    assert select_partitions.run(select_argv(tmp_path, path, "tsv", "--allowlist", str(allow), "--seed", "4")) == 0
    entries = ["i0", "i2", "i4", "t0"]
    want = reference.select(reference.user_sets_from_pairs(PAIRS), "basic", PARAMS, seed=4, allowlist=entries)
    got = released(tmp_path, "items")
    assert got == sorted(want) and "i0" in got  # i0 (held by 300 users) is the entry after the BOM


def test_public_counts_with_a_bom_read_as_without(tmp_path):
    plain = pio.load_public_counts(str(_write(tmp_path, "p.tsv", public_bytes())), 2)
    for name, data in (
        ("bom.tsv", b"\xef\xbb\xbf" + public_bytes()),
        ("bom-crlf.tsv.gz", gzip.compress(b"\xef\xbb\xbf" + public_bytes().replace(b"\n", b"\r\n"))),
    ):
        prior = pio.load_public_counts(str(_write(tmp_path, name, data)), 2)
        assert list(prior.vocab) == list(plain.vocab) and list(prior.alpha) == list(plain.alpha)
        assert not any("\ufeff" in g for g in prior.vocab)


def test_private_input_with_a_bom_and_a_header(tmp_path):
    path = _write(tmp_path, "in.tsv", b"\xef\xbb\xbfuser\titem\r\n" + tsv_bytes())
    assert select_partitions.run(select_argv(tmp_path, path, "tsv", "--seed", "6")) == 0
    want = reference.select(reference.user_sets_from_pairs(PAIRS), "basic", PARAMS, seed=6)
    assert released(tmp_path, "items") == sorted(want)


@pytest.mark.parametrize("damage", sorted(DAMAGED))
def test_load_public_counts_raises_the_documented_error(tmp_path, damage):
    suffix, spoil, message = DAMAGED[damage]
    path = _write(tmp_path, "public.tsv" + suffix, spoil(public_bytes()))
    with pytest.raises(pio.InputFileError) as e:
        pio.load_public_counts(str(path), 2)
    assert str(e.value) == f"{path}: {message}"


# --- record rules: TAB in an item, jsonl numbers, headers -------------------------------------------


def _bad_record(path, line, reason):
    return f"bad input record: {path}:{line}: {reason} (use --skip_bad_records to skip and count bad records)"


TAB = "value contains a TAB (outputs are item<TAB>count)"


@pytest.mark.parametrize("fmt", ["tsv", "jsonl"])
def test_tab_inside_an_item_is_a_bad_record(tmp_path, capsys, fmt):
    if fmt == "tsv":
        path, reason = _write(tmp_path, "in.tsv", tsv_bytes() + b"u9\ta\tb\n"), TAB
    else:
        path, reason = _write(tmp_path, "in.jsonl", jsonl_bytes([*PAIRS, ("u9", "a\tb")])), f"'item': {TAB}"
    line = len(PAIRS) + 1
    run_fails(
        capsys, tmp_path, select_partitions.run, select_argv(tmp_path, path, fmt), _bad_record(path, line, reason)
    )


def test_texts_may_hold_tabs(tmp_path):
    recs = [(u, t.replace(" ", "\t", 1)) for u, t in TEXTS]
    for fmt, data in (("jsonl", jsonl_bytes(recs, "text")), ("tsv", tsv_bytes(recs))):
        path = _write(tmp_path, "in." + fmt, data)
        assert extract_ngrams.run(ngrams_argv(tmp_path, path, fmt, "--seed", "5", name=fmt)) == 0
        params = DPNEParams(epsilon=4, delta=1e-5, max_n=2, max_contributions=5)
        want = dpne_reference(recs, "dpne", params, seed=5).lines()
        got = released(tmp_path, "ngrams", name=fmt)
        assert got == sorted(want) and got


@pytest.mark.parametrize("number", ["1E2", "1e400", "Infinity", "-Infinity", "NaN", "3", "-0.5"])
def test_jsonl_number_item_is_a_bad_record(tmp_path, capsys, number):
    path = _write(tmp_path, "in.jsonl", jsonl_bytes(PAIRS) + b'{"user": "u9", "item": ' + number.encode() + b"}\n")
    message = _bad_record(path, len(PAIRS) + 1, "'item': value must be a JSON string, got number")
    run_fails(capsys, tmp_path, select_partitions.run, select_argv(tmp_path, path, "jsonl"), message)


def test_jsonl_user_ids_stay_string_or_integer(tmp_path):
    rows = [(int(u[1:]) if k % 2 else u[1:], i) for k, (u, i) in enumerate(PAIRS)]
    path = _write(tmp_path, "in.jsonl", jsonl_bytes(rows))
    assert select_partitions.run(select_argv(tmp_path, path, "jsonl", "--seed", "2")) == 0
    want = reference.select(reference.user_sets_from_pairs((str(u), i) for u, i in rows), "basic", PARAMS, seed=2)
    assert released(tmp_path, "items") == sorted(want)


@pytest.mark.parametrize(
    "header, flag",
    [("uid\titem", "item"), ("User\tItem", "item"), ("user\tword", "item"), ("user\tbody", "text")],
)
def test_tsv_header_with_other_column_names_is_an_error_naming_them(tmp_path, capsys, header, flag):
    if flag == "item":
        path = _write(tmp_path, "in.tsv", header.encode() + b"\n" + tsv_bytes())
        run, argv, expected = select_partitions.run, select_argv(tmp_path, path, "tsv"), "user<TAB>item"
    else:
        path = _write(tmp_path, "in.tsv", header.encode() + b"\n" + tsv_bytes(TEXTS))
        run, argv, expected = extract_ngrams.run, ngrams_argv(tmp_path, path, "tsv"), "user<TAB>text"
    shown = header.replace("\t", "<TAB>")
    reason = f"header '{shown}' does not name the expected columns '{expected}' (set --user_column / --{flag}_column)"
    run_fails(capsys, tmp_path, run, argv, _bad_record(path, 1, reason))


def test_tsv_header_naming_the_configured_columns_is_skipped(tmp_path):
    path = _write(tmp_path, "in.tsv", b"uid\tword\n" + tsv_bytes())
    argv = select_argv(tmp_path, path, "tsv", "--user_column", "uid", "--item_column", "word", "--seed", "8")
    assert select_partitions.run(argv) == 0
    want = reference.select(reference.user_sets_from_pairs(PAIRS), "basic", PARAMS, seed=8)
    assert released(tmp_path, "items") == sorted(want)


# --- open_input: every compression, every cut ---------------------------------------------------------

COMPRESSORS = {
    ".gz": gzip.compress,
    ".bz2": bz2.compress,
    ".xz": lzma.compress,
    ".lzma": lambda d: lzma.compress(d, format=lzma.FORMAT_ALONE),
    ".deflate": zlib.compress,
    ".zst": lambda d: zstandard.ZstdCompressor(write_checksum=True).compress(d),
    ".zstd": lambda d: zstandard.ZstdCompressor(write_checksum=False, write_content_size=False).compress(d),
}
# formats whose every stream carries a checksum of its data: a changed byte is always detected
CHECKED = (".gz", ".bz2", ".xz", ".deflate", ".zst")


def _read(path):
    with pio.open_input(str(path)) as f:
        return f.read()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.sampled_from(sorted(COMPRESSORS)),
    st.lists(st.binary(max_size=1500) | st.text(max_size=800).map(str.encode), min_size=1, max_size=3),
    st.lists(st.floats(0, 1, exclude_max=True), max_size=8),
)
def test_open_input_reads_every_stream_and_rejects_every_cut_inside_one(tmp_path, ext, chunks, fractions):
    # The file is one compressed stream per chunk, concatenated. Property: reading the whole file gives
    # the chunks joined; a strict prefix of the file (cut at byte c) gives, when c is exactly the end of
    # stream k >= 1, the first k chunks joined (a shorter file that is complete in its own right: no
    # format can tell it from a whole one), and otherwise raises InputFileError "PATH: truncated ..."
    # (c = 0 included: an empty compressed file is truncated).
    streams = [COMPRESSORS[ext](c) for c in chunks]
    blob = b"".join(streams)
    ends = {sum(len(s) for s in streams[: k + 1]): k + 1 for k in range(len(streams))}
    path = tmp_path / ("f" + ext)
    path.write_bytes(blob)
    assert _read(path) == b"".join(chunks)
    cuts = {0, 1, len(blob) - 1, *(int(f * len(blob)) for f in fractions)}
    cuts |= {e + d for e in ends for d in (-1, 0, 1)}
    for cut in sorted(c for c in cuts if 0 <= c < len(blob)):
        path.write_bytes(blob[:cut])
        if cut in ends:
            assert _read(path) == b"".join(chunks[: ends[cut]]), cut
        else:
            with pytest.raises(pio.InputFileError) as e:
                _read(path)
            assert str(e.value).startswith(f"{path}: truncated "), (cut, str(e.value))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.sampled_from(CHECKED),
    st.binary(min_size=1, max_size=2000),
    st.floats(0, 1, exclude_max=True),
    st.integers(1, 255),
)
def test_open_input_changed_byte_is_detected_or_harmless(tmp_path, ext, data, where, xor):
    # One byte of a checksummed stream changed: the read raises InputFileError, or returns exactly the
    # original data (the byte was in a field no decoder reads, e.g. gzip's modification time).
    blob = bytearray(COMPRESSORS[ext](data))
    blob[int(where * len(blob))] ^= xor
    path = tmp_path / ("f" + ext)
    path.write_bytes(bytes(blob))
    try:
        got = _read(path)
    except pio.InputFileError as e:
        assert str(e).startswith(f"{path}: ") and "\n" not in str(e)
    else:
        assert got == data


@pytest.mark.parametrize("ext", sorted(COMPRESSORS))
def test_plain_text_with_a_compressed_name_is_not_valid(tmp_path, ext):
    path = _write(tmp_path, "in.tsv" + ext, tsv_bytes())
    with pytest.raises(pio.InputFileError) as e:
        _read(path)
    name = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".lzma": "lzma", ".deflate": "deflate (zlib)"}.get(ext, "zstd")
    assert str(e.value) == (
        f"{path}: not a valid {name} file (it does not start with the {name} magic bytes; an uncompressed file "
        f"named *{ext}?)"
    )


@pytest.mark.parametrize("ext", sorted(COMPRESSORS))
def test_bytes_after_the_last_stream_are_an_error(tmp_path, ext):
    path = _write(tmp_path, "f" + ext, COMPRESSORS[ext](b"abc\n") + b"trailing garbage")
    with pytest.raises(pio.InputFileError, match=r"corrupt .* file \(the bytes after compressed stream 1 are not"):
        _read(path)


def test_uncompressed_files_are_opened_seekable_and_whole(tmp_path):
    path = _write(tmp_path, "in.tsv", b"abc\ndef")
    with pio.open_input(str(path)) as f:
        f.seek(4)
        assert f.read() == b"def"


@pytest.mark.parametrize("ext", [".gz", ".bz2", ".xz", ".zst"])
def test_decompression_memory_is_bounded(tmp_path, ext):
    # 64 MiB of zeros compress to a few KB; reading them in 64 KiB pieces holds a few MiB at most
    import tracemalloc

    path = _write(tmp_path, "zeros" + ext, COMPRESSORS[ext](bytes(64 << 20)))
    tracemalloc.start()
    total = 0
    with pio.open_input(str(path)) as f:
        while True:
            piece = f.read(1 << 16)
            if not piece:
                break
            total += len(piece)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert total == 64 << 20 and peak < 24 << 20, peak
