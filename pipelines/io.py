"""Reading user-level records (tsv, jsonl, parquet) with strict, reported handling of bad records.

Formats (``value`` is the item for select_partitions and the text for extract_ngrams):
  tsv      ``user<TAB>value`` per line, UTF-8. Split at the first TAB (the value is the rest of
           the line). An optional header line equal to ``<user_column><TAB><value_column>`` as the
           first line of a file is skipped. Empty lines carry no record and are ignored.
  jsonl    one JSON object per line with keys ``user_column`` and ``value_column``; the user may be
           a string or an integer (read as its decimal string), the value a string (numbers are read
           as their JSON text). Empty lines are ignored.
  parquet  columns ``user_column`` and ``value_column`` (string or integer columns).
Files ending in .gz/.bz2/.zst etc. are decompressed by Beam's FileSystems. Any path or glob Beam's
filesystems understand (local, gs://, s3://, hdfs://) works.

Bad records (wrong number of fields, invalid JSON, missing/null/empty user or value, a value made
only of whitespace, a value longer than ``max_value_length`` characters, a line that is not valid
UTF-8, a value with a line break when ``allow_newlines`` is False, a value that is not a string) are
never silently dropped: by default the pipeline fails with ``BadRecordError: <file>:<line>: <reason>`` of the first
bad record met; with ``skip_bad_records=True`` they are skipped and go to the ``bad`` output of
:class:`ReadRecords` (one 1 each). Their number is data-dependent, so it is not a default Beam
counter nor in the report: the pipelines count it only in the opt-in NON-PRIVATE ``--diagnostics``
output (:mod:`pipelines.observability`).

Documented handling (not errors):
  * duplicated lines / repeated (user, item) pairs: a user holds an item or not; repeats count once
    (``BoundContributions`` takes distinct pairs).
  * user ids are strings. jsonl integers are read as their decimal text, so ``1`` and ``"1"`` are
    the SAME user. Merging ids is the privacy-safe direction (one person's records can never be
    split across two pipeline users, which would multiply their contribution); floats, booleans,
    null and objects are bad records.
  * items/texts are opaque: no trimming or normalisation (``" a"`` and ``"a"`` are different items);
    whitespace-only values are bad records.
  * empty input (no files match: an error; files exist but hold no record at all) fails with
    :class:`EmptyInputError` from :class:`FailIfEmpty`.
Memory: a line is read with a bounded ``readline``; an over-long line is reported as a bad record
(and skipped in chunks with ``skip_bad_records``) without loading it whole.
"""

from __future__ import annotations

import json
import math
from typing import Optional, Tuple

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems

from transforms.bayesian.bayesian_kernels import PublicPrior

INPUT_FORMATS = ("tsv", "jsonl", "parquet")
# Default --max_item_length (select_partitions) and --max_text_length (extract_ngrams), in characters.
DEFAULT_MAX_ITEM_LENGTH = 10_000
DEFAULT_MAX_TEXT_LENGTH = 1_000_000
# A line may be longer than its value (user, JSON syntax, \uXXXX escapes): bytes read per line are
# capped at this multiple of the value limit plus slack; longer lines are bad records.
_LINE_BYTES_PER_CHAR = 12
_LINE_SLACK = 4096


def read_lines(raw, cap: Optional[int], chunk_size: int = 1 << 16):
    """Yields ``(line_bytes, overlong)`` from a binary stream, reading fixed-size chunks.

    A line longer than ``cap`` bytes is yielded once as ``(b"", True)`` and its bytes are discarded
    as they stream past, so memory stays O(cap + chunk_size) whatever the input holds. Works on any
    stream with ``read(n)`` (Beam's ``CompressedFile.readline`` takes no size argument).
    """
    buf = bytearray()
    skipping = False
    while True:
        chunk = raw.read(chunk_size)
        if not chunk:
            break
        buf += chunk
        start = 0
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            if skipping:
                skipping = False
            elif cap is not None and nl + 1 - start > cap:
                yield b"", True
            else:
                yield bytes(buf[start : nl + 1]), False
            start = nl + 1
        del buf[:start]
        if cap is not None and len(buf) > cap:
            if not skipping:
                yield b"", True
                skipping = True
            buf.clear()
    if buf and not skipping:
        if cap is not None and len(buf) > cap:
            yield b"", True
        else:
            yield bytes(buf), False


class BadRecordError(ValueError):
    """A malformed input record; the message starts with ``<file>:<line>:``."""


class EmptyInputError(ValueError):
    """The input files hold no record at all."""


def check_not_empty(count: int, pattern: str) -> int:
    if count == 0:
        raise EmptyInputError(
            f"input: no records in {pattern} (the files are empty or hold only headers/blank lines or only bad records)"
        )
    return count


class FailIfEmpty(beam.PTransform):
    """records -> nothing; fails the pipeline with :class:`EmptyInputError` if there is no record.

    The count never leaves the pipeline (it is compared with 0 and dropped).
    """

    def __init__(self, pattern: str, label=None):
        super().__init__(label)
        self._pattern = pattern

    def expand(self, records):
        return (
            records
            | "CountRecords" >> beam.combiners.Count.Globally()  # number of records (stays inside)
            | "CheckNotEmpty" >> beam.Map(check_not_empty, self._pattern)  # fails on 0
        )


def _as_user(value) -> Optional[str]:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        return value if value != "" else None
    if isinstance(value, int):
        return str(value)
    return None


def _as_value(value, allow_newlines: bool, max_length: Optional[int] = None) -> Tuple[Optional[str], str]:
    if isinstance(value, bool) or value is None:
        return None, "null or boolean value"
    if isinstance(value, (int, float)):
        value = json.dumps(value)
    if not isinstance(value, str):
        return None, f"value must be a string, got {type(value).__name__}"
    if value == "":
        return None, "empty value"
    if not value.strip():
        return None, "value is only whitespace"
    if max_length is not None and len(value) > max_length:
        return (
            None,
            f"value has {len(value)} characters, more than the limit {max_length} "
            "(raise it with --max_{value}_length)",
        )
    if not allow_newlines and ("\n" in value or "\r" in value):
        return None, "value contains a line break (outputs are one item per line)"
    return value, ""


class _Bad:
    """A bad record's reason (``{value}`` not yet replaced by the value column's name)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason


def _has_surrogate(text: str) -> bool:
    """True for a str holding a lone surrogate (JSON ``"\\ud800"``): not valid Unicode, not encodable."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _check_max_value_length(max_value_length, value_column):
    if max_value_length is not None and (
        isinstance(max_value_length, bool) or not isinstance(max_value_length, int) or max_value_length < 1
    ):
        raise ValueError(f"max_{value_column}_length must be an integer >= 1, got {max_value_length!r}")


class _LineParser:
    """The per-record rules shared by :class:`ParseFileFn` and :class:`ReadRecordBatches`.

    ``line(data, overlong, first_line)`` -> ``(user, value)``, ``None`` (no record: blank line or
    header) or :class:`_Bad`; ``row(user, value)`` does the same for one parquet row.
    """

    def __init__(self, input_format, user_column, value_column, allow_newlines, max_value_length):
        self.format = input_format
        self.user_col = user_column
        self.value_col = value_column
        self.allow_newlines = allow_newlines
        self.max_len = max_value_length
        self.line_cap = None if max_value_length is None else _LINE_BYTES_PER_CHAR * max_value_length + _LINE_SLACK

    def line(self, data: bytes, overlong: bool, first_line: bool):
        if overlong:
            return _Bad(
                f"line longer than {self.line_cap} bytes (value limit "
                f"{self.max_len} characters; raise it with --max_{{value}}_length)"
            )
        try:
            line = data.decode("utf-8")
        except UnicodeDecodeError as e:
            return _Bad(f"not valid UTF-8 ({e.reason} at byte {e.start})")
        line = line.rstrip("\n").rstrip("\r")
        if not line.strip():
            return None
        if self.format == "tsv":
            return self._tsv(line, first_line)
        return self._jsonl(line)

    def _tsv(self, line, first_line):
        if "\t" not in line:
            return _Bad("expected user<TAB>value")
        user, value = line.split("\t", 1)
        if first_line and user == self.user_col and value == self.value_col:
            return None  # header
        if user == "":
            return _Bad("empty user")
        value, reason = _as_value(value, self.allow_newlines, self.max_len)
        if value is None:
            return _Bad(reason)
        return user, value

    def _jsonl(self, line):
        try:
            obj = json.loads(line)
        except ValueError as e:
            return _Bad(f"invalid JSON ({e})")
        if not isinstance(obj, dict):
            return _Bad("expected a JSON object")
        if self.user_col not in obj or self.value_col not in obj:
            return _Bad(f"missing key {self.user_col!r} or {self.value_col!r}")
        user = _as_user(obj[self.user_col])
        if user is None:
            return _Bad(f"{self.user_col!r} must be a non-empty string or an integer")
        value, reason = _as_value(obj[self.value_col], self.allow_newlines, self.max_len)
        if value is None:
            return _Bad(f"{self.value_col!r}: {reason}")
        if _has_surrogate(user) or _has_surrogate(value):
            return _Bad("a lone surrogate escape (\\ud800-\\udfff) is not valid Unicode")
        return user, value

    def row(self, user, value):
        u = _as_user(user)
        if u is None:
            return _Bad(f"{self.user_col!r} null or empty")
        v, reason = _as_value(value, self.allow_newlines, self.max_len)
        if v is None:
            return _Bad(f"{self.value_col!r}: {reason}")
        return u, v

    def message(self, path, line_no, reason: str) -> str:
        reason = reason.replace("{value}", self.value_col)
        return f"{path}:{line_no}: {reason} (use --skip_bad_records to skip and count bad records)"


class ParseFileFn(beam.DoFn):
    """FileMetadata -> (user, value) records; bad records raise or go to the 'bad' output."""

    BAD = "bad"

    def __init__(
        self,
        input_format: str,
        user_column: str,
        value_column: str,
        skip_bad_records: bool,
        allow_newlines: bool,
        max_value_length: Optional[int] = None,
    ):
        if input_format not in INPUT_FORMATS:
            raise ValueError(f"input_format must be one of {', '.join(INPUT_FORMATS)}, got {input_format!r}")
        _check_max_value_length(max_value_length, value_column)
        self._format = input_format
        self._user_col = user_column
        self._value_col = value_column
        self._skip = skip_bad_records
        self._parser = _LineParser(input_format, user_column, value_column, allow_newlines, max_value_length)
        self._line_cap = self._parser.line_cap

    def _bad(self, path, line_no, reason):
        if not self._skip:
            raise BadRecordError(self._parser.message(path, line_no, reason))
        return beam.pvalue.TaggedOutput(self.BAD, 1)

    def process(self, metadata):
        path = metadata.path
        if self._format == "parquet":
            yield from self._parquet(path)
            return
        with FileSystems.open(path) as raw:
            line_no = 0
            for data, overlong in read_lines(raw, self._line_cap):
                line_no += 1
                out = self._parser.line(data, overlong, line_no == 1)
                if out is None:
                    continue
                if isinstance(out, _Bad):
                    yield self._bad(path, line_no, out.reason)
                else:
                    yield out

    def _parquet(self, path):
        import pyarrow.parquet as pq

        with FileSystems.open(path) as raw:
            pf = pq.ParquetFile(raw)
            names = pf.schema_arrow.names
            for col in (self._user_col, self._value_col):
                if col not in names:
                    raise BadRecordError(f"{path}: no column {col!r} (columns: {', '.join(names)})")
            row = 0
            for batch in pf.iter_batches(columns=[self._user_col, self._value_col], batch_size=65536):
                users = batch.column(0).to_pylist()
                values = batch.column(1).to_pylist()
                for user, value in zip(users, values):
                    row += 1
                    out = self._parser.row(user, value)
                    if isinstance(out, _Bad):
                        yield self._bad(path, f"row {row}", out.reason)
                    else:
                        yield out


class ReadRecords(beam.PTransform):
    """Reads (user, value) records from files matching a pattern.

    Returns a ``DoOutputsTuple``-like pair: ``result.records`` ((user, value) PCollection) and
    ``result.bad`` (a PCollection with one 1 per skipped bad record).
    """

    def __init__(
        self,
        file_pattern: str,
        input_format: str,
        user_column: str = "user",
        value_column: str = "item",
        skip_bad_records: bool = False,
        allow_newlines: bool = False,
        max_value_length: Optional[int] = None,
        label=None,
    ):
        super().__init__(label)
        self._pattern = file_pattern
        self._fn = ParseFileFn(
            input_format, user_column, value_column, skip_bad_records, allow_newlines, max_value_length
        )

    def expand(self, pbegin):
        outputs = (
            pbegin
            | "MatchFiles"
            >> fileio.MatchFiles(
                self._pattern, empty_match_treatment=fileio.EmptyMatchTreatment.DISALLOW
            )  # FileMetadata (fails if nothing matches)
            | "SpreadFiles" >> beam.Reshuffle()  # FileMetadata, one file per work item
            | "Parse" >> beam.ParDo(self._fn).with_outputs(ParseFileFn.BAD, main="records")
        )  # records: (user, value); bad: 1 per skipped record
        return outputs


# ---------------------------------------------------------------------------------------------
# Public n-gram counts (the Bayesian prior): read by the launcher, bounded and public
# ---------------------------------------------------------------------------------------------


def load_public_counts(path: str, n: int) -> PublicPrior:
    """Reads ``n-gram<TAB>count`` lines (gzip etc. by extension). Errors name the file and line."""
    counts = {}
    try:
        f = FileSystems.open(path)
    except Exception as e:  # noqa: BLE001  (any filesystem's "not found")
        raise ValueError(f"--public: cannot open {path!r}: {e}") from None
    with f:
        for line_no, raw in enumerate(iter(f.readline, b""), 1):
            try:
                line = raw.decode("utf-8").rstrip("\n").rstrip("\r")
            except UnicodeDecodeError:
                raise ValueError(f"--public {path}:{line_no}: not valid UTF-8") from None
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) != 2:
                raise ValueError(f"--public {path}:{line_no}: expected n-gram<TAB>count")
            gram, value = parts
            if gram != " ".join(gram.split()) or len(gram.split()) != n:
                raise ValueError(
                    f"--public {path}:{line_no}: expected an n-gram of {n} words joined by single spaces, got {gram!r}"
                )
            try:
                count = float(value)
            except ValueError:
                raise ValueError(f"--public {path}:{line_no}: count must be a number, got {value!r}") from None
            if not math.isfinite(count) or count < 0:
                raise ValueError(f"--public {path}:{line_no}: count must be finite and >= 0, got {value!r}")
            if gram in counts:
                raise ValueError(f"--public {path}:{line_no}: duplicate n-gram {gram!r}")
            counts[gram] = count
    if not counts:
        raise ValueError(f"--public {path}: no n-grams (the public vocabulary must not be empty)")
    return PublicPrior.from_counts(counts)


def read_allowlist(pipeline: beam.Pipeline, path: str):
    """The allowlist file(s) as a PCollection of items (empty lines dropped)."""
    return (
        pipeline
        | "ReadAllowlist" >> beam.io.ReadFromText(path)  # line
        | "AllowlistItems" >> beam.Filter(bool)  # item
    )
