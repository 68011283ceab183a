"""Every reader verifies its file (issue 27, points 2, 8 and the readers of 9).

Readers: the private input (tsv, jsonl; ``select_partitions``, ``extract_ngrams`` and
``bayesian_ngrams``), the allowlist (``--allowlist`` of the first two) and the Bayesian public counts
(``--public``). A truncated compressed file, a corrupt one (bad CRC), an uncompressed file with a
compressed name, a directory, a missing, empty, binary or non-UTF-8 allowlist, a non-parquet file read
as parquet raise the documented error naming the file; a CLI then exits 3 with that one ``error: ...``
line, no traceback, no file written or changed. Plus the record rules of the same issue: TAB in an item,
jsonl numbers as items, a tsv header with other column names, and a UTF-8 BOM at the start of every
kind of file.

Every damage x reader and every record rule is checked on the reader itself, in ms: the private input
through the reader each CLI builds for its arguments (:class:`tests.support.cli.CliReader`), the
allowlist through ``_MatchAllowlistFn`` / ``allowlist_entries`` / ``check_allowlist_not_empty`` (the steps
of ``read_allowlist``), the public counts through ``load_public_counts``. A CLI run is kept for what only
the CLI does: one damaged file per reader of each CLI (the error met in a worker, or at build time for
``--public``, becomes exit 3 + one line + no output), and one run per other error class (no allowlist
file, an empty allowlist per CLI, a file that is not parquet), plus the seeded runs that tie a reader to
the release (multi-member gzip input, an allowlist with a BOM == the reference).
"""

import bz2
import collections
import gzip
import json
import lzma
import zlib

import apache_beam as beam
import pytest
import zstandard
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dp_partition_beam.pipelines import bayesian_ngrams, extract_ngrams, select_partitions
from dp_partition_beam.pipelines import io as pio
from dp_partition_beam.privacy.selection import SelectionParams
from dp_partition_beam.transforms import reference

from tests.support.cli import CliReader, bayes_argv, ngrams_argv, released, run_fails, select_argv

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


# --- the readers -------------------------------------------------------------------------------------


def _write(tmp_path, name, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _input_reader(module, argv):
    """The private-input reader of a CLI: the path -> (records, skipped) of the reader it builds."""
    return lambda t, p: CliReader(module, argv(t, p)).read()


def _allowlist(t, p):
    """The steps of ``read_allowlist``: the files the pattern matches, then their entries."""
    return [entry for path in pio._MatchAllowlistFn().process(str(p)) for entry in pio.allowlist_entries(path)]


def _public(t, p):
    prior = pio.load_public_counts(str(p), 2)
    return list(prior.vocab), list(prior.alpha)


def _select(t, p, *extra, fmt=None):
    return select_argv(p, t / "out", *extra, fmt=fmt or ("jsonl" if ".jsonl" in p.name else "tsv"))


def _ngrams(t, p, *extra, fmt=None):
    return ngrams_argv(p, t / "out", *extra, fmt=fmt or ("tsv" if ".tsv" in p.name else "jsonl"))


def _ngrams_with_allowlist(t, p):
    return _ngrams(t, _write(t, "in.jsonl", jsonl_bytes(TEXTS, "text")), "--allowlist", p)


def _bayes(t, p):
    return bayes_argv(p, _write(t, "public.tsv", public_bytes()), t / "out")


# Each reader: (the good content, the file's name, its reader (tmp_path, path) -> what it read, and the CLI
# run that reads the file: (tmp_path, path) -> (run, argv); the other files a run needs are written intact)
READERS = {
    "select-tsv": (tsv_bytes, "in.tsv", _input_reader(select_partitions, _select), (select_partitions.run, _select)),
    "select-jsonl": (
        lambda: jsonl_bytes(PAIRS),
        "in.jsonl",
        _input_reader(select_partitions, _select),
        (select_partitions.run, _select),
    ),
    "ngrams-jsonl": (
        lambda: jsonl_bytes(TEXTS, "text"),
        "in.jsonl",
        _input_reader(extract_ngrams, _ngrams),
        (extract_ngrams.run, _ngrams),
    ),
    "ngrams-tsv": (
        lambda: tsv_bytes(TEXTS),
        "in.tsv",
        _input_reader(extract_ngrams, _ngrams),
        (extract_ngrams.run, _ngrams),
    ),
    "bayes-jsonl": (
        lambda: jsonl_bytes(TEXTS, "text"),
        "in.jsonl",
        _input_reader(bayesian_ngrams, _bayes),
        (bayesian_ngrams.run, _bayes),
    ),
    "allowlist": (
        allowlist_bytes,
        "allow.txt",
        _allowlist,
        (select_partitions.run, lambda t, p: _select(t, _write(t, "in.tsv", tsv_bytes()), "--allowlist", p)),
    ),
    "ngrams-allowlist": (
        lambda: b"w0 w1\nw1\nw2 w0\n",
        "allow.txt",
        _allowlist,
        (
            extract_ngrams.run,
            lambda t, p: _ngrams(t, _write(t, "in.jsonl", jsonl_bytes(TEXTS, "text")), "--allowlist", p),
        ),
    ),
    "public": (
        public_bytes,
        "public.tsv",
        _public,
        (bayesian_ngrams.run, lambda t, p: bayes_argv(_write(t, "in.jsonl", jsonl_bytes(TEXTS, "text")), p, t / "out")),
    ),
}


def _directory_message(path):
    return f"{path} is a directory, not a file (give a file, or a glob of files such as {path}/*)"


def _spoiled(tmp_path, reader, damage):
    """The reader's file with ``damage`` (a DAMAGED kind, or "directory": a directory in its place) and
    the message its reader must raise."""
    content, name, _, _ = READERS[reader]
    if damage == "directory":
        path = tmp_path / "adir"
        path.mkdir()
        _write(path, name, content())
        return path, _directory_message(path)
    suffix, spoil, message = DAMAGED[damage]
    path = _write(tmp_path, name + suffix, spoil(content()))
    return path, f"{path}: {message}"


@pytest.mark.parametrize("damage", [*sorted(DAMAGED), "directory"])
@pytest.mark.parametrize("reader", sorted(READERS))
def test_damaged_file_raises_one_line_naming_it(tmp_path, reader, damage):
    # every reader x every damage, on the reader: InputFileError with exactly the documented line
    path, message = _spoiled(tmp_path, reader, damage)
    with pytest.raises(pio.InputFileError) as e:
        READERS[reader][2](tmp_path, path)
    assert str(e.value) == message


# one CLI run per reader: the damages spread over them (a worker's error for the input and the allowlist,
# the launcher's for --public)
CLI_DAMAGE = {
    "select-tsv": "truncated-gz",
    "select-jsonl": "bad-crc-gz",
    "ngrams-jsonl": "plain-text-named-gz",
    "ngrams-tsv": "truncated-bz2",
    "bayes-jsonl": "directory",
    "allowlist": "directory",
    "ngrams-allowlist": "truncated-gz",
    "public": "bad-crc-gz",
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_damaged_file_fails_the_cli_with_one_line_naming_it(tmp_path, capsys, reader):
    path, message = _spoiled(tmp_path, reader, CLI_DAMAGE[reader])
    run, argv = READERS[reader][3]
    run_fails(capsys, tmp_path, run, argv(tmp_path, path), message)


@pytest.mark.parametrize("reader", sorted(READERS))
def test_intact_compressed_files_read_as_the_uncompressed_one(tmp_path, reader):
    # a multi-member gzip (three members, as `cat a.gz b.gz c.gz` makes) reads as the uncompressed file
    # (other formats and concatenations: the open_input tests; through a CLI: the test below)
    content, name, read, _ = READERS[reader]
    data = content()
    lines = data.splitlines(keepends=True)
    cut = [0, len(lines) // 3, 2 * len(lines) // 3, len(lines)]
    thirds = [b"".join(lines[a:b]) for a, b in zip(cut, cut[1:])]
    plain = read(tmp_path, _write(tmp_path, name, data))
    assert plain and plain == read(tmp_path, _write(tmp_path, name + ".gz", b"".join(gzip.compress(t) for t in thirds)))


def test_intact_multi_member_gzip_input_equals_the_reference(tmp_path):
    members = [tsv_bytes(PAIRS[k::4]) for k in range(4)]
    path = _write(tmp_path, "in.tsv.gz", b"".join(gzip.compress(m) for m in members))
    assert select_partitions.run(_select(tmp_path, path, "--seed", "11")) == 0
    want = reference.select(reference.user_sets_from_pairs(PAIRS), "basic", PARAMS, seed=11)
    got = released(tmp_path / "out", "items")
    assert sorted(want) == got and {"i0", "i1"} <= set(got)


# --- directories, missing and empty files ------------------------------------------------------------


def test_a_directory_as_parquet_input_or_public_fails_naming_it(tmp_path):
    # the parquet reader's and load_public_counts' own directory checks (tsv/jsonl and the allowlist: the
    # damage matrix above)
    d = tmp_path / "adir"
    d.mkdir()
    (d / "f.parquet").write_bytes(b"")
    for module, argv in ((select_partitions, _select), (extract_ngrams, _ngrams)):
        with pytest.raises(pio.InputFileError) as e:
            CliReader(module, argv(tmp_path, d, fmt="parquet")).read()
        assert str(e.value) == _directory_message(d)
    with pytest.raises(pio.InputFileError, match="is a directory"):
        pio.load_public_counts(str(d), 2)


def test_missing_allowlist_names_the_allowlist(tmp_path, capsys):
    path = _write(tmp_path, "in.tsv", tsv_bytes())
    missing = tmp_path / "nope.txt"
    with pytest.raises(pio.InputFileError) as e:
        _allowlist(tmp_path, missing)
    assert str(e.value) == f"allowlist: no file matches {missing}"
    argv = _select(tmp_path, path, "--allowlist", missing)
    run_fails(capsys, tmp_path, select_partitions.run, argv, f"allowlist: no file matches {missing}")


def _no_entries(allow):
    return (
        f"allowlist: no entries in {allow} (the files are empty or hold only blank lines; an empty allowlist "
        "would release nothing)"
    )


@pytest.mark.parametrize("content", [b"", b"\n\n\r\n", b"\xef\xbb\xbf\n"], ids=["empty", "blank-lines", "bom-only"])
def test_empty_allowlist_has_no_entry(tmp_path, content):
    # no entry read, and the count's check (read_allowlist's CheckAllowlistNotEmpty) fails on 0
    allow = _write(tmp_path, "allow.txt", content)
    assert _allowlist(tmp_path, allow) == []
    with pytest.raises(pio.EmptyInputError) as e:
        pio.check_allowlist_not_empty(0, str(allow))
    assert str(e.value) == _no_entries(allow)
    assert pio.check_allowlist_not_empty(1, str(allow)) == 1


def test_empty_allowlist_fails_both_clis(tmp_path, capsys):
    allow = _write(tmp_path, "allow.txt", b"\n\n\r\n")
    argv = _select(tmp_path, _write(tmp_path, "in.tsv", tsv_bytes()), "--allowlist", allow)
    run_fails(capsys, tmp_path, select_partitions.run, argv, _no_entries(allow))
    argv = _ngrams(tmp_path, _write(tmp_path, "in.jsonl", jsonl_bytes(TEXTS, "text")), "--allowlist", allow)
    run_fails(capsys, tmp_path, extract_ngrams.run, argv, _no_entries(allow))


@pytest.mark.parametrize(
    "content, line, reason",
    [
        (b"i0\ni1\x00\x01\x02\n", 2, "binary data (a NUL byte; an allowlist is UTF-8 text, one item per line)"),
        (b"\xff\xfei0\n", 1, "not valid UTF-8 (invalid start byte at byte 0)"),
        (b"i0\ni\xc3(\n", 2, "not valid UTF-8 (invalid continuation byte at byte 1)"),
    ],
    ids=["nul", "utf16-bom", "bad-continuation"],
)
def test_binary_or_non_utf8_allowlist_names_the_line(tmp_path, content, line, reason):
    allow = _write(tmp_path, "allow.txt", content)
    with pytest.raises(pio.InputFileError) as e:
        _allowlist(tmp_path, allow)
    assert str(e.value) == f"{allow}:{line}: {reason}"


def test_file_that_is_not_parquet_fails_with_one_line(tmp_path, capsys):
    path = _write(tmp_path, "in.parquet", tsv_bytes())
    for module, argv in ((select_partitions, _select), (extract_ngrams, _ngrams)):
        message = CliReader(module, argv(tmp_path, path, fmt="parquet")).error()
        assert message.startswith(f"{path}: not a parquet file (") and "magic bytes" in message
    run_fails(capsys, tmp_path, select_partitions.run, _select(tmp_path, path, fmt="parquet"), message)


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
    assert select_partitions.run(_select(tmp_path, path, "--allowlist", allow, "--seed", "4")) == 0
    entries = ["i0", "i2", "i4", "t0"]
    want = reference.select(reference.user_sets_from_pairs(PAIRS), "basic", PARAMS, seed=4, allowlist=entries)
    got = released(tmp_path / "out", "items")
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


def _records(pairs):
    return collections.Counter((str(u), v) for u, v in pairs)


def test_private_input_with_a_bom_and_a_header(tmp_path):
    path = _write(tmp_path, "in.tsv", b"\xef\xbb\xbfuser\titem\r\n" + tsv_bytes())
    assert CliReader(select_partitions, _select(tmp_path, path)).read() == (_records(PAIRS), 0)


@pytest.mark.parametrize("damage", sorted(DAMAGED))
def test_load_public_counts_raises_the_documented_error(tmp_path, damage):
    suffix, spoil, message = DAMAGED[damage]
    path = _write(tmp_path, "public.tsv" + suffix, spoil(public_bytes()))
    with pytest.raises(pio.InputFileError) as e:
        pio.load_public_counts(str(path), 2)
    assert str(e.value) == f"{path}: {message}"


# --- record rules: TAB in an item, jsonl numbers, headers -------------------------------------------


def _bad_record(path, line, reason):
    return f"{path}:{line}: {reason} (use --skip_bad_records to skip and count bad records)"


TAB = "value contains a TAB (outputs are item<TAB>count)"


@pytest.mark.parametrize("fmt", ["tsv", "jsonl"])
def test_tab_inside_an_item_is_a_bad_record(tmp_path, fmt):
    if fmt == "tsv":
        path, reason = _write(tmp_path, "in.tsv", tsv_bytes() + b"u9\ta\tb\n"), TAB
    else:
        path, reason = _write(tmp_path, "in.jsonl", jsonl_bytes([*PAIRS, ("u9", "a\tb")])), f"'item': {TAB}"
    assert CliReader(select_partitions, _select(tmp_path, path)).error() == _bad_record(path, len(PAIRS) + 1, reason)


def test_texts_may_hold_tabs(tmp_path):
    recs = [(u, t.replace(" ", "\t", 1)) for u, t in TEXTS]
    for fmt, data in (("jsonl", jsonl_bytes(recs, "text")), ("tsv", tsv_bytes(recs))):
        path = _write(tmp_path, "in." + fmt, data)
        assert CliReader(extract_ngrams, _ngrams(tmp_path, path)).read() == (_records(recs), 0)


@pytest.mark.parametrize("number", ["1E2", "1e400", "Infinity", "-Infinity", "NaN", "3", "-0.5"])
def test_jsonl_number_item_is_a_bad_record(tmp_path, number):
    path = _write(tmp_path, "in.jsonl", jsonl_bytes(PAIRS) + b'{"user": "u9", "item": ' + number.encode() + b"}\n")
    message = _bad_record(path, len(PAIRS) + 1, "'item': value must be a JSON string, got number")
    assert CliReader(select_partitions, _select(tmp_path, path)).error() == message


def test_jsonl_user_ids_stay_string_or_integer(tmp_path):
    rows = [(int(u[1:]) if k % 2 else u[1:], i) for k, (u, i) in enumerate(PAIRS)]
    path = _write(tmp_path, "in.jsonl", jsonl_bytes(rows))
    assert CliReader(select_partitions, _select(tmp_path, path)).read() == (_records(rows), 0)


@pytest.mark.parametrize(
    "header, flag",
    [("uid\titem", "item"), ("User\tItem", "item"), ("user\tword", "item"), ("user\tbody", "text")],
)
def test_tsv_header_with_other_column_names_is_an_error_naming_them(tmp_path, header, flag):
    if flag == "item":
        path = _write(tmp_path, "in.tsv", header.encode() + b"\n" + tsv_bytes())
        reader, expected = CliReader(select_partitions, _select(tmp_path, path)), "user<TAB>item"
    else:
        path = _write(tmp_path, "in.tsv", header.encode() + b"\n" + tsv_bytes(TEXTS))
        reader, expected = CliReader(extract_ngrams, _ngrams(tmp_path, path)), "user<TAB>text"
    shown = header.replace("\t", "<TAB>")
    reason = f"header '{shown}' does not name the expected columns '{expected}' (set --user_column / --{flag}_column)"
    assert reader.error() == _bad_record(path, 1, reason)


def test_tsv_header_naming_the_configured_columns_is_skipped(tmp_path):
    # --user_column / --item_column reach the select CLI's reader: the header is skipped, the rest read
    path = _write(tmp_path, "in.tsv", b"uid\tword\n" + tsv_bytes())
    argv = _select(tmp_path, path, "--user_column", "uid", "--item_column", "word")
    assert CliReader(select_partitions, argv).read() == (_records(PAIRS), 0)


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
