"""Reading user-level records (tsv, jsonl, parquet) with strict, reported handling of bad records.

Formats (``value`` is the item for select_partitions and the text for extract_ngrams):
  tsv      ``user<TAB>value`` per line, UTF-8. Split at the first TAB (the value is the rest of
           the line; an item may not hold another TAB, a text may). Empty lines carry no record and
           are ignored. The first line of a file (after a UTF-8 BOM, see below) is a header when it
           is exactly ``<user_column><TAB><value_column>``: it is skipped. It is a WRONG header, a bad
           record ``FILE:1: header 'uid<TAB>item' does not name the expected columns
           'user<TAB>item' (set --user_column / --item_column)``, when its first field equals
           ``user_column`` or the rest of the line equals ``value_column``, compared ignoring case
           and surrounding whitespace, without being exactly the header. (A first line that names
           neither column cannot be told from data: it is a record.)
  jsonl    one JSON object per line with keys ``user_column`` and ``value_column``; the user may be
           a string or an integer (read as its decimal string), the value must be a JSON string
           (numbers, booleans, null, objects and arrays are bad records: ``'item': value must be a
           JSON string, got number``; a number's text would otherwise be rewritten, ``1E2`` as
           ``100.0``). Empty lines are ignored.
  parquet  columns ``user_column`` and ``value_column`` (string or integer columns). A file that is
           not parquet raises :class:`InputFileError` ``FILE: not a parquet file (...)``.
A UTF-8 byte order mark at the start of a file is dropped (tsv, jsonl, the allowlist, the public
counts); CRLF line ends are read as LF. Any path or glob Beam's filesystems understand (local,
gs://, s3://, hdfs://) works.

Compressed files (``.gz``, ``.bz2``, ``.xz``/``.lzma``, ``.deflate``, ``.zst``/``.zstd``, detected
by name as Beam does) are decompressed by :func:`open_input`, which every reader of the package uses
(the private input in both readers, the allowlist, the Bayesian public counts). Beam's own
decompressing reader stops quietly where the file stops, so a truncated ``.gz`` (a partial copy)
would be read up to the cut, its partial last line taken as a record. :func:`open_input` checks that
every compressed stream reaches its end-of-stream marker and passes its check (gzip CRC-32 and
length, bzip2 CRCs, xz check, zlib Adler-32, zstd checksum when the frame has one); concatenated
streams (multi-member gzip) are read whole. Otherwise :class:`InputFileError`, one line naming the
file: ``FILE: truncated gzip stream (the file ends before its end-of-stream marker; a partial
copy?)``, ``FILE: corrupt gzip data (...)``, ``FILE: not a valid gzip file (it does not start with
the gzip magic bytes; an uncompressed file named *.gz?)``, ``FILE: corrupt gzip file (the bytes
after compressed stream N are not a gzip stream: ...)``. A local directory where a file is expected
raises ``PATH is a directory, not a file (...)``.

Bad records (wrong number of fields, invalid JSON, missing/null/empty user or value, a value made
only of whitespace, a value longer than ``max_value_length`` characters, a line that is not valid
UTF-8, a value with a line break when ``allow_newlines`` is False, a value with a TAB when
``allow_tabs`` is False (by default: when line breaks are not allowed, i.e. for items), a value
that is not a string, a wrong tsv header) are never silently dropped: by default the pipeline fails
with ``BadRecordError: <file>:<line>: <reason>`` of the first bad record met; with
``skip_bad_records=True`` they are skipped and go to the ``bad`` output of :class:`ReadRecords` (one
1 each). Their number is data-dependent, so it is not a default Beam counter nor in the report: the
pipelines count it only in the opt-in NON-PRIVATE ``--diagnostics`` output
(:mod:`pipelines.observability`).

Documented errors (the CLIs print one ``error: ...`` line and exit with code 3; matched by class
name, ``pipelines.cli.DOCUMENTED_ERRORS``): :class:`BadRecordError` (a record, ``FILE:LINE: ...``),
:class:`EmptyInputError` (no record in the input, no entry in the allowlist), :class:`InputFileError`
(a file that cannot be read as what it claims to be; the message starts with its path, or with
``allowlist:`` when no file matches the allowlist pattern).

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
The allowlist (:func:`read_allowlist`): one item per line, UTF-8; blank lines are no entry; a NUL
byte (``FILE:LINE: binary data ...``), invalid UTF-8 (``FILE:LINE: not valid UTF-8 ...``), no
matching file (``allowlist: no file matches PATTERN``) raise :class:`InputFileError`; no entry at
all raises :class:`EmptyInputError` (``allowlist: no entries in PATTERN ...``): an empty allowlist
would release nothing.
Two readers: :class:`ReadRecords` (one element per record: the oracle, for tests and benchmarks) and
:class:`ReadRecordBatches` (what the CLIs use), which gives the same records as Arrow record batches
(columns ``user`` and the value's name), with the same errors and skip counts (its ``bad`` output
holds one count per work item instead of one 1 per record). Uncompressed tsv/jsonl files are split
into byte ranges read by separate work items; each range is checked in large blocks with
numpy/Arrow, and only the lines those checks cannot clear go through the per-line rules above
(:class:`_LineParser`).
Memory: a line is read with a bounded ``readline``; an over-long line is reported as a bad record
(and skipped in chunks with ``skip_bad_records``) without loading it whole. Decompression produces
at most about 1 MiB (zstd: 8 MiB) per step, whatever the compression ratio.
"""

from __future__ import annotations

import bz2
import contextlib
import copy
import io
import json
import lzma
import math
import os
import zlib
from typing import NamedTuple, Optional, Tuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
import zstandard
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from dp_partition_beam.transforms.bayesian.bayesian_kernels import PublicPrior

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
    """The input files hold no record at all (or an allowlist holds no entry)."""


class InputFileError(ValueError):
    """A file that cannot be read as what it claims to be: a truncated, corrupt or mislabelled
    compressed file, a directory, a file that is not parquet, a binary or non-UTF-8 allowlist.

    The message is one line and starts with the file's path (``FILE: ...``, ``FILE:LINE: ...``,
    ``PATH is a directory ...``), or with the file's role when there is no file
    (``allowlist: no file matches PATTERN``).
    """


# ---------------------------------------------------------------------------------------------
# Opening a file: compressed streams decompressed here, their end verified
# ---------------------------------------------------------------------------------------------

# Compressed bytes read from the file at a time, and the most decompressed bytes one step produces.
_RAW_CHUNK = 1 << 16
_STEP_OUTPUT = 1 << 20
# zstd's decompressobj has no output limit: it is fed this many compressed bytes per call, which
# bounds one call's output (a zstd block of 128 KiB takes at least 4 bytes: <= 8 MiB per call).
_ZSTD_FEED = 256
_ZSTD_MAX_WINDOW = 1 << 31  # as Beam's CompressedFile (python-zstandard issue 157)


def _looks_like_zlib(head: bytes) -> bool:
    return len(head) >= 2 and head[0] & 0x0F == 8 and ((head[0] << 8) | head[1]) % 31 == 0


class _Codec(NamedTuple):
    """How to decompress one compression type: a fresh decompressor per stream (member)."""

    name: str  # as in messages
    new: object  # () -> decompressor with decompress(), eof, unused_data
    magic: object  # head bytes -> True if the file starts like a stream of this type
    api: str  # "zlib": unconsumed_tail; "buffered" (bz2, lzma): needs_input; "zstd": no output limit


_CODECS = {
    CompressionTypes.GZIP: _Codec(
        "gzip", lambda: zlib.decompressobj(zlib.MAX_WBITS | 16), lambda h: h[:2] == b"\x1f\x8b", "zlib"
    ),
    CompressionTypes.BZIP2: _Codec("bzip2", bz2.BZ2Decompressor, lambda h: h[:3] == b"BZh", "buffered"),
    CompressionTypes.LZMA: _Codec(
        "xz/lzma", lzma.LZMADecompressor, lambda h: h[:6] == b"\xfd7zXZ\x00" or h[:3] == b"\x5d\x00\x00", "buffered"
    ),
    CompressionTypes.DEFLATE: _Codec("deflate (zlib)", zlib.decompressobj, _looks_like_zlib, "zlib"),
    CompressionTypes.ZSTD: _Codec(
        "zstd",
        lambda: zstandard.ZstdDecompressor(max_window_size=_ZSTD_MAX_WINDOW).decompressobj(),
        lambda h: h[:4] == b"\x28\xb5\x2f\xfd" or (len(h) >= 4 and h[0] & 0xF0 == 0x50 and h[1:4] == b"\x2a\x4d\x18"),
        "zstd",
    ),
}
_CODEC_ERRORS = (zlib.error, OSError, EOFError, lzma.LZMAError, zstandard.ZstdError)


class _VerifiedDecompressor(io.RawIOBase):
    """The decompressed bytes of a compressed file, which must end where its last stream ends.

    Streams (gzip members, bzip2/xz/zstd streams or frames, zlib streams) may be concatenated, as
    Beam reads them. Raises :class:`InputFileError` when the file ends inside a stream (or is
    empty), when a stream is corrupt (CRC/length/checksum mismatch, invalid data), when the file
    does not start like a stream of its type (an uncompressed file with a compressed name), or when
    bytes after a complete stream are not a stream. zstd detects corrupt data only in frames written
    with a checksum (the ``zstd`` command writes one by default); every other type always checks.
    """

    def __init__(self, raw, path: str, compression: str):
        super().__init__()
        self._raw = raw
        self._path = path
        self._codec = _CODECS[compression]
        self._name = "xz" if path.lower().endswith(".xz") else self._codec.name.replace("xz/lzma", "lzma")
        self._d = None  # the current stream's decompressor
        self._feed = b""  # compressed bytes not yet given to it
        self._wants_input = True
        self._streams = 0  # streams started
        self._stream_out = 0  # bytes the current stream produced
        self._head = b""  # the file's first bytes
        self._out = b""
        self._pos = 0
        self._done = False

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            try:
                self._raw.close()
            finally:
                super().close()

    def readinto(self, b) -> int:
        while self._pos == len(self._out) and not self._done:
            self._out, self._pos = self._step(), 0
        n = min(len(b), len(self._out) - self._pos)
        b[:n] = self._out[self._pos : self._pos + n]
        self._pos += n
        return n

    def _error(self, what: str) -> InputFileError:
        return InputFileError(f"{self._path}: {what}")

    def _truncated(self) -> InputFileError:
        detail = "the file is empty" if not self._head else "the file ends before its end-of-stream marker"
        return self._error(f"truncated {self._name} stream ({detail}; a partial copy?)")

    def _corrupt(self, e: BaseException) -> InputFileError:
        name = self._name
        detail = " ".join(str(e).split()) or type(e).__name__
        if self._stream_out == 0 and self._streams == 1 and not self._codec.magic(self._head):
            ext = os.path.splitext(self._path)[1]
            return self._error(
                f"not a valid {name} file (it does not start with the {name} magic bytes; an uncompressed file "
                f"named *{ext}?)"
            )
        if self._stream_out == 0 and self._streams > 1:
            return self._error(
                f"corrupt {name} file (the bytes after compressed stream {self._streams - 1} are not a {name} "
                f"stream: {detail})"
            )
        return self._error(f"corrupt {name} data ({detail})")

    def _step(self) -> bytes:
        """Some decompressed bytes (possibly none); sets ``_done`` at the verified end of the file."""
        codec = self._codec
        if self._d is None:  # between streams
            data = self._feed or self._raw.read(_RAW_CHUNK)
            if not data:
                if self._streams == 0:
                    raise self._truncated()  # an empty file: not even a header
                self._done = True
                return b""
            if self._streams == 0:
                self._head = bytes(data[:8])
            self._d, self._feed, self._wants_input = codec.new(), data, False
            self._streams += 1
            self._stream_out = 0
        if not self._feed and self._wants_input:
            self._feed = self._raw.read(_RAW_CHUNK)
            if not self._feed:
                raise self._truncated()  # the file ends inside a stream
        d = self._d
        try:
            if codec.api == "zstd":  # a small piece of input per call
                piece = memoryview(self._feed)[:_ZSTD_FEED]
                out = d.decompress(piece)
                self._feed = self._feed[len(piece) :]
                self._wants_input = True
            elif codec.api == "zlib":
                out = d.decompress(self._feed, _STEP_OUTPUT)
                self._feed = d.unconsumed_tail
                self._wants_input = len(out) < _STEP_OUTPUT  # a full buffer may leave output pending
            else:  # bz2, lzma: the decompressor keeps unused input itself
                out = d.decompress(self._feed, _STEP_OUTPUT)
                self._feed = b""
                self._wants_input = d.needs_input
        except _CODEC_ERRORS as e:
            raise self._corrupt(e) from None
        self._stream_out += len(out)
        if d.eof:
            self._feed = d.unused_data + bytes(self._feed)
            self._d = None
        return out


def is_directory(path: str) -> bool:
    """True for a local path that is a directory (other filesystems have no directories to open)."""
    return FileSystems.get_scheme(path) in (None, "file") and os.path.isdir(path.removeprefix("file://"))


def check_not_directory(path: str) -> None:
    """Raises :class:`InputFileError` ``PATH is a directory ...`` for a local directory."""
    if is_directory(path):
        raise InputFileError(
            f"{path} is a directory, not a file (give a file, or a glob of files such as {os.path.join(path, '*')})"
        )


def open_input(path: str):
    """Opens a file for reading: a binary stream of its (decompressed) bytes.

    The compression type is the one Beam detects from the name (``.gz``, ``.bz2``, ``.xz``/``.lzma``,
    ``.deflate``, ``.zst``/``.zstd``); a compressed file is decompressed here rather than by Beam's
    ``CompressedFile``, which stops quietly where the file stops: here a file that ends inside a
    compressed stream, a corrupt stream (CRC or length mismatch) or a file whose content is not of
    its type raises :class:`InputFileError` (``FILE: truncated gzip stream (...)``,
    ``FILE: corrupt gzip data (...)``, ``FILE: not a valid gzip file (...)``). Concatenated streams
    (multi-member gzip) are read whole. Other files are Beam's uncompressed stream (seekable). A
    local directory raises ``PATH is a directory ...``.
    """
    check_not_directory(path)
    compression = CompressionTypes.detect_compression_type(path)
    raw = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    if compression == CompressionTypes.UNCOMPRESSED:
        return raw
    return io.BufferedReader(_VerifiedDecompressor(raw, path, compression), buffer_size=_RAW_CHUNK)


def check_not_empty(count: int, pattern: str) -> int:
    if count == 0:
        raise EmptyInputError(
            f"input: no records in {pattern} (the files are empty or hold only headers/blank lines or only bad records)"
        )
    return count


class FailIfEmpty(beam.PTransform):
    """records (elements or Arrow batches) -> nothing; fails with :class:`EmptyInputError` if there is no record.

    The count never leaves the pipeline (it is compared with 0 and dropped).
    """

    def __init__(self, pattern: str, label=None):
        super().__init__(label)
        self._pattern = pattern

    def expand(self, records):
        return (
            records
            | "RecordsOf" >> beam.Map(records_in)  # rows of a batch, or 1 per record
            | "CountRecords" >> beam.CombineGlobally(sum)  # number of records (stays inside)
            | "CheckNotEmpty" >> beam.Map(check_not_empty, self._pattern)  # fails on 0
        )


def records_in(element) -> int:
    """The number of records an element carries: a batch's rows, else 1."""
    num_rows = getattr(element, "num_rows", None)
    return 1 if num_rows is None else int(num_rows)


def _as_user(value) -> Optional[str]:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        return value if value != "" else None
    if isinstance(value, int):
        return str(value)
    return None


def _as_value(
    value, allow_newlines: bool, max_length: Optional[int] = None, allow_tabs: Optional[bool] = None
) -> Tuple[Optional[str], str]:
    """A record's value (parquet cells may be integers, read as their decimal text) and the reason
    it is bad ("" if it is not)."""
    if allow_tabs is None:
        allow_tabs = allow_newlines
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
    if not allow_tabs and "\t" in value:
        return None, "value contains a TAB (outputs are item<TAB>count)"
    return value, ""


def _json_kind(value) -> str:
    """The JSON type name of a parsed JSON value."""
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return "number"
    return {dict: "object", list: "array", str: "string"}.get(type(value), type(value).__name__)


_BOM = b"\xef\xbb\xbf"


def _shown(text: str, limit: int = 120) -> str:
    """A line as shown in a message: TABs as <TAB>, at most ``limit`` characters."""
    text = text.replace("\t", "<TAB>")
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Bad:
    """A bad record's reason, without the file and line."""

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


def _check_max_value_length(max_value_length, value_name):
    if max_value_length is not None and (
        isinstance(max_value_length, bool) or not isinstance(max_value_length, int) or max_value_length < 1
    ):
        raise ValueError(f"max_{value_name}_length must be an integer >= 1, got {max_value_length!r}")


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


@contextlib.contextmanager
def _parquet_file(path: str):
    """The ``pyarrow.parquet.ParquetFile`` of ``path``; :class:`InputFileError` if it is not parquet."""
    import pyarrow.parquet as pq

    check_not_directory(path)
    with FileSystems.open(path) as raw:
        try:
            pf = pq.ParquetFile(raw)
        except (pa.ArrowException, OSError) as e:  # ArrowInvalid: "Parquet magic bytes not found ..."
            raise InputFileError(f"{path}: not a parquet file ({_one_line(e)})") from None
        yield pf


def _parquet_batches(path: str, pf, **kwargs):
    """``pf.iter_batches(**kwargs)``; a file pyarrow cannot read raises :class:`InputFileError`."""
    batches = pf.iter_batches(**kwargs)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as e:
            raise InputFileError(f"{path}: cannot read the parquet file ({_one_line(e)})") from None
        yield batch


class _LineParser:
    """The per-record rules shared by :class:`ParseFileFn` and :class:`ReadRecordBatches`.

    ``line(data, overlong, first_line)`` -> ``(user, value)``, ``None`` (no record: blank line or
    header) or :class:`_Bad`; ``row(user, value)`` does the same for one parquet row.
    ``allow_tabs`` (default: ``allow_newlines``): whether a value may hold a TAB; an item may not
    (outputs are ``item<TAB>count``), a text may. ``value_name`` (default ``text`` when line breaks
    are allowed, else ``item``) names the flags in messages (``--max_item_length``, ``--item_column``).
    """

    def __init__(
        self,
        input_format,
        user_column,
        value_column,
        allow_newlines,
        max_value_length,
        allow_tabs: Optional[bool] = None,
        value_name: Optional[str] = None,
    ):
        self.format = input_format
        self.user_col = user_column
        self.value_col = value_column
        self.allow_newlines = allow_newlines
        self.allow_tabs = allow_newlines if allow_tabs is None else bool(allow_tabs)
        self.value_name = value_name or ("text" if allow_newlines else "item")
        # bytes a value may not hold (UTF-8: they never occur inside a multi-byte character)
        self.forbidden_bytes = (() if allow_newlines else (10, 13)) + (() if self.allow_tabs else (9,))
        self.max_len = max_value_length
        self.line_cap = None if max_value_length is None else _LINE_BYTES_PER_CHAR * max_value_length + _LINE_SLACK

    def line(self, data: bytes, overlong: bool, first_line: bool):
        if overlong:
            return _Bad(
                f"line longer than {self.line_cap} bytes (value limit "
                f"{self.max_len} characters; raise it with --max_{self.value_name}_length)"
            )
        if first_line and data.startswith(_BOM):
            data = data[len(_BOM) :]  # a UTF-8 byte order mark at the start of the file
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
        if first_line:
            if user == self.user_col and value == self.value_col:
                return None  # header
            if self._names_a_column(user, self.user_col) or self._names_a_column(value, self.value_col):
                return _Bad(
                    f"header '{_shown(line)}' does not name the expected columns "
                    f"'{_shown(self.user_col + chr(9) + self.value_col)}' "
                    f"(set --user_column / --{self.value_name}_column)"
                )
        if user == "":
            return _Bad("empty user")
        value, reason = self._value(value)
        if value is None:
            return _Bad(reason)
        return user, value

    def first_line_is_special(self, content: bytes) -> bool:
        """Whether a file's first line (without its line end) needs :meth:`line`: it starts with a
        BOM or, in tsv, may be a header (a field naming a column; checked for a header there)."""
        if content.startswith(_BOM):
            return True
        if self.format != "tsv":
            return False
        try:
            user, value = content.decode("utf-8").split("\t", 1)
        except (UnicodeDecodeError, ValueError):
            return True
        return self._names_a_column(user, self.user_col) or self._names_a_column(value, self.value_col)

    @staticmethod
    def _names_a_column(field: str, column: str) -> bool:
        """The first line's field equals a column name, ignoring case and surrounding whitespace."""
        return field.strip().casefold() == column.strip().casefold()

    def _value(self, value):
        value, reason = _as_value(value, self.allow_newlines, self.max_len, self.allow_tabs)
        return value, reason.replace("{value}", self.value_name)

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
        value = obj[self.value_col]
        if not isinstance(value, str):  # numbers too: their text would be rewritten (1E2 -> 100.0)
            return _Bad(f"{self.value_col!r}: value must be a JSON string, got {_json_kind(value)}")
        value, reason = self._value(value)
        if value is None:
            return _Bad(f"{self.value_col!r}: {reason}")
        if _has_surrogate(user) or _has_surrogate(value):
            return _Bad("a lone surrogate escape (\\ud800-\\udfff) is not valid Unicode")
        return user, value

    def row(self, user, value):
        u = _as_user(user)
        if u is None:
            return _Bad(f"{self.user_col!r} null or empty")
        v, reason = self._value(value)
        if v is None:
            return _Bad(f"{self.value_col!r}: {reason}")
        return u, v

    def message(self, path, line_no, reason: str) -> str:
        return f"{path}:{line_no}: {reason} (use --skip_bad_records to skip and count bad records)"


class ParseFileFn(beam.DoFn):
    """FileMetadata -> (user, value) records; bad records raise or go to the 'bad' output.

    The per-record oracle of :class:`ReadRecordBatches` (through :class:`ReadRecords`): one line at a
    time through :class:`_LineParser`, no vectorised check. The CLIs read with ReadRecordBatches."""

    BAD = "bad"

    def __init__(
        self,
        input_format: str,
        user_column: str,
        value_column: str,
        skip_bad_records: bool,
        allow_newlines: bool,
        max_value_length: Optional[int] = None,
        allow_tabs: Optional[bool] = None,
        value_name: Optional[str] = None,
    ):
        if input_format not in INPUT_FORMATS:
            raise ValueError(f"input_format must be one of {', '.join(INPUT_FORMATS)}, got {input_format!r}")
        self._format = input_format
        self._user_col = user_column
        self._value_col = value_column
        self._skip = skip_bad_records
        self._parser = _LineParser(
            input_format, user_column, value_column, allow_newlines, max_value_length, allow_tabs, value_name
        )
        _check_max_value_length(max_value_length, self._parser.value_name)
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
        with open_input(path) as raw:  # a truncated or corrupt compressed file raises InputFileError
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
        with _parquet_file(path) as pf:
            names = pf.schema_arrow.names
            for col in (self._user_col, self._value_col):
                if col not in names:
                    raise BadRecordError(f"{path}: no column {col!r} (columns: {', '.join(names)})")
            row = 0
            for batch in _parquet_batches(path, pf, columns=[self._user_col, self._value_col], batch_size=65536):
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
    """Reads (user, value) records from files matching a pattern, one Beam element per record.

    The oracle of :class:`ReadRecordBatches`, as ``reference.py`` is for the algorithms: the plain
    per-line reading that the batched reader must reproduce exactly (records, skip counts, errors;
    tests/pipelines/test_io_batches.py). No pipeline of the package reads with it (the CLIs use
    ReadRecordBatches); it stays for the tests and ``benchmarks/explore/bench_readers.py``.

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
        allow_tabs: Optional[bool] = None,
        value_name: Optional[str] = None,
    ):
        super().__init__(label)
        self._pattern = file_pattern
        self._fn = ParseFileFn(
            input_format,
            user_column,
            value_column,
            skip_bad_records,
            allow_newlines,
            max_value_length,
            allow_tabs,
            value_name,
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
# Batched reading: Arrow record batches, byte ranges, vectorised checks
# ---------------------------------------------------------------------------------------------

DEFAULT_BATCH_ROWS = 65536
DEFAULT_BLOCK_BYTES = 64 << 20
# pyarrow.json parses the candidate lines of a block in pieces of about this many bytes, so a line it
# rejects sends only its piece to the per-line parser.
_JSON_PIECE_BYTES = 4 << 20
# Text is checked with numpy in blocks of at most this many bytes (a range of block_bytes is read in
# several), which bounds the per-line index arrays (~70 bytes per line) of one block. Reading the 4M-pair
# Zipf TSV (49 MB) and nothing else peaked at 498 MB with 16 MB blocks, 382 / 301 / 264 MB with 8 / 4 / 2
# MB (benchmarks/bench_read_floor.py; docs/columnar.md, "Memory").
_VECTOR_BYTES = 4 << 20
# First bytes of the UTF-8 encodings of the characters str.strip() removes (str.isspace): a value
# made only of whitespace starts with one of them (tests/pipelines/test_io_batches.py checks the list).
_WS_LEAD_BYTES = (9, 10, 11, 12, 13, 28, 29, 30, 31, 32, 0xC2, 0xE1, 0xE2, 0xE3)
_WS_LEAD = np.zeros(256, dtype=bool)
_WS_LEAD[list(_WS_LEAD_BYTES)] = True
# Substrings that Arrow's JSON parser accepts as numbers and Python's json module does not.
_JSON_LENIENT = (b"Inf", b"NaN")


class _Piece(NamedTuple):
    """One work item: a byte range of a text file or a run of row groups of a parquet file.

    tsv/jsonl: the lines that START in ``[start, end)`` (``end`` None: to the end of the file; a
    compressed file is one piece ``(0, None)``). parquet: row groups ``[start, end)``, with
    ``row_offset`` rows in the groups before ``start``.
    """

    path: str
    start: int
    end: Optional[int]
    row_offset: int = 0


def _is_compressed(path: str) -> bool:
    return CompressionTypes.detect_compression_type(path) != CompressionTypes.UNCOMPRESSED


def _split_file(metadata, input_format: str, block_bytes: int):
    """FileMetadata -> the file's work items (:class:`_Piece`)."""
    path = metadata.path
    check_not_directory(path)
    if input_format == "parquet":
        with _parquet_file(path) as pf:
            meta = pf.metadata
        first, offset, rows, size = 0, 0, 0, 0
        for g in range(meta.num_row_groups):
            rows += meta.row_group(g).num_rows
            size += meta.row_group(g).total_byte_size
            if size >= block_bytes or g == meta.num_row_groups - 1:
                yield _Piece(path, first, g + 1, offset)
                first, offset, size = g + 1, offset + rows, 0
                rows = 0
        if meta.num_row_groups == 0:
            yield _Piece(path, 0, 0, 0)  # still checks the columns
        return
    size = metadata.size_in_bytes
    if _is_compressed(path) or size <= block_bytes:
        yield _Piece(path, 0, None)
        return
    for start in range(0, size, block_bytes):
        yield _Piece(path, start, start + block_bytes if start + block_bytes < size else None)


def _read_upto(raw, n: int) -> bytes:
    """Up to ``n`` bytes; fewer only at the end of the stream."""
    out = raw.read(n)
    if len(out) < n and out:
        parts = [out]
        got = len(out)
        while got < n:
            more = raw.read(n - got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        out = b"".join(parts)
    return out


def _first_line_start(raw, start: int, end: Optional[int]) -> Optional[int]:
    """The offset of the first line starting in ``[start, end)`` (``start`` > 0), or None."""
    pos = start - 1
    raw.seek(pos)
    while end is None or pos < end - 1:
        chunk = raw.read(1 << 20 if end is None else min(1 << 20, end - 1 - pos))
        if not chunk:
            return None
        nl = chunk.find(b"\n")
        if nl >= 0:
            return pos + nl + 1
        pos += len(chunk)
    return None


def _line_blocks(raw, limit: Optional[int], block_bytes: int, cap: Optional[int]):
    """Blocks of whole lines from a stream positioned at a line start.

    Yields ``bytes`` (whole lines; the last one lacks its newline only at the end of the stream) and
    ``None`` for a line longer than ``cap`` bytes that was skipped without being held. Covers the
    lines starting in the first ``limit`` bytes (None: all) and reads on to the end of the last one.
    """
    carry = b""
    skipping = False
    remaining = limit
    eof = False
    while remaining is None or remaining > 0:
        chunk = _read_upto(raw, block_bytes if remaining is None else min(block_bytes, remaining))
        if not chunk:
            eof = True
            break
        if remaining is not None:
            remaining -= len(chunk)
        if skipping:
            nl = chunk.find(b"\n")
            if nl < 0:
                continue
            chunk = chunk[nl + 1 :]
            skipping = False
        data = carry + chunk if carry else chunk
        last = data.rfind(b"\n")
        if last >= 0:
            yield data[: last + 1] if last + 1 < len(data) else data
            carry = data[last + 1 :]
        else:
            carry = data
        if cap is not None and len(carry) > cap:
            yield None
            carry, skipping = b"", True
    while not eof and (carry or skipping):  # the last line started before the limit: read to its end
        chunk = raw.read(1 << 16)
        if not chunk:
            break
        nl = chunk.find(b"\n")
        if skipping:
            if nl >= 0:
                skipping = False
                break
            continue
        carry += chunk if nl < 0 else chunk[: nl + 1]
        if nl >= 0:
            yield carry  # an over-long line here is flagged by its length
            carry = b""
            break
        if cap is not None and len(carry) > cap:
            yield None
            carry, skipping = b"", True
    if carry:
        yield None if cap is not None and len(carry) > cap else carry


def _utf8_ok(data) -> bool:
    """Arrow's (SIMD) UTF-8 validation of a whole block; as strict as Python's decoder."""
    array = pa.LargeStringArray.from_buffers(
        1, pa.py_buffer(np.array([0, len(data)], dtype=np.int64)), pa.py_buffer(data)
    )
    try:
        array.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _string_parts(array: pa.Array):
    """(offsets, data) of a string array as numpy views (offsets relative to ``data``)."""
    buffers = array.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int32)[array.offset : array.offset + len(array) + 1]
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    return offsets, data


def _rows_containing(offsets: np.ndarray, data: np.ndarray, byte_values) -> np.ndarray:
    """Boolean per row: the row's bytes contain one of ``byte_values``."""
    hit = np.zeros(len(offsets) - 1, dtype=bool)
    if len(offsets) < 2:
        return hit
    lo, hi = int(offsets[0]), int(offsets[-1])
    region = data[lo:hi]
    mask = region == byte_values[0]
    for b in byte_values[1:]:
        mask |= region == b
    pos = np.flatnonzero(mask) + lo
    if len(pos):
        hit[np.searchsorted(offsets, pos, side="right") - 1] = True
    return hit


class _BatchReader:
    """Reads one :class:`_Piece` into Arrow batches; the per-record rules are :class:`_LineParser`'s.

    ``read(piece)`` yields ``pa.RecordBatch`` es and ints (numbers of skipped bad records). Every
    record a vectorised check cannot clear (or a whole block/batch that fails a block-level check)
    goes through the per-record parser, which gives the same record, skip or message as
    :class:`ParseFileFn`.
    """

    def __init__(
        self,
        input_format,
        user_column,
        value_column,
        skip_bad_records,
        allow_newlines,
        max_value_length,
        value_name,
        batch_rows,
        block_bytes,
        allow_tabs=None,
    ):
        self.format = input_format
        self.skip = skip_bad_records
        self.parser = _LineParser(
            input_format, user_column, value_column, allow_newlines, max_value_length, allow_tabs, value_name
        )
        self.batch_rows = batch_rows
        self.block_bytes = block_bytes
        self.schema = pa.schema(
            [pa.field("user", pa.string(), nullable=False), pa.field(value_name, pa.string(), nullable=False)]
        )

    # -- shared ---------------------------------------------------------------------------------

    def _strict(self) -> "_BatchReader":
        strict = copy.copy(self)
        strict.skip = False
        return strict

    def _batches(self, users: pa.Array, values: pa.Array):
        """Batches of at most batch_rows rows, each with buffers of its own (take copies)."""
        for a in range(0, len(users), self.batch_rows):
            idx = pa.array(np.arange(a, min(a + self.batch_rows, len(users)), dtype=np.int64))
            yield pa.RecordBatch.from_arrays([users.take(idx), values.take(idx)], schema=self.schema)

    def _py_batches(self, records):
        for a in range(0, len(records), self.batch_rows):
            part = records[a : a + self.batch_rows]
            yield pa.RecordBatch.from_arrays(
                [pa.array([u for u, _ in part], pa.string()), pa.array([v for _, v in part], pa.string())],
                schema=self.schema,
            )

    def read(self, piece: _Piece):
        """Yields the piece's batches and skipped-record counts (ints); raises on a bad record if strict."""
        if self.format == "parquet":
            return self._parquet(piece)
        return self._text(piece)

    # -- tsv / jsonl ----------------------------------------------------------------------------

    def _text(self, piece: _Piece):
        """Generator; its return value is the number of lines read."""
        path, start, end = piece.path, piece.start, piece.end
        cap = self.parser.line_cap
        lines = 0
        if start == 0:
            raw = open_input(path)  # decompresses .gz etc., verifying the end of the stream
        else:
            raw = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
        with raw:
            limit = end
            if start > 0:
                p0 = _first_line_start(raw, start, end)
                if p0 is None:
                    return 0
                raw.seek(p0)
                limit = None if end is None else end - p0
            for block in _line_blocks(raw, limit, min(self.block_bytes, _VECTOR_BYTES), cap):
                first = start == 0 and lines == 0

                def fail(index, reason, base=lines):
                    self._fail(piece, base + index, reason)

                if block is None:
                    out = self.parser.line(b"", True, first)
                    if self.skip:
                        yield 1
                    else:
                        fail(0, out.reason)
                    lines += 1
                    continue
                n = yield from self._text_block(block, first, fail)
                lines += n
        return lines

    def _fail(self, piece: _Piece, index: int, reason: str):
        """Raises the file's first bad record: the pieces before this one are checked first."""
        base = 0
        if self.format == "parquet":
            if piece.start > 0:
                for _ in self._strict()._parquet(_Piece(piece.path, 0, piece.start, 0)):
                    pass
            raise BadRecordError(self.parser.message(piece.path, f"row {index + 1}", reason))
        if piece.start > 0:  # line numbers: count the lines before the piece (raising an earlier bad one)
            gen = self._strict()._text(_Piece(piece.path, 0, piece.start))
            while True:
                try:
                    next(gen)
                except StopIteration as stop:
                    base = stop.value
                    break
        raise BadRecordError(self.parser.message(piece.path, base + index + 1, reason))

    def _text_block(self, data: bytes, first_is_file_start: bool, fail):
        """Whole lines -> batches and skip counts; returns the number of lines."""
        arr = np.frombuffer(data, dtype=np.uint8)
        size = len(arr)
        nls = np.flatnonzero(arr == 10)
        n = len(nls) + (1 if size and arr[-1] != 10 else 0)
        if n == 0:
            return 0
        line_end = np.empty(n, dtype=np.int64)  # offset of the line's newline (or of the end)
        line_end[: len(nls)] = nls
        if n > len(nls):
            line_end[-1] = size
        starts = np.empty(n, dtype=np.int64)
        starts[0] = 0
        starts[1:] = line_end[:-1] + 1
        full_len = np.minimum(line_end + 1, size) - starts
        ends = line_end.copy()  # content end after rstrip("\r")
        special = np.zeros(n, dtype=bool)  # decided by the per-line parser
        for _ in range(4):
            cr = (ends > starts) & (arr[np.maximum(ends - 1, 0)] == 13)
            if not cr.any():
                break
            ends[cr] -= 1
        else:
            special |= (ends > starts) & (arr[np.maximum(ends - 1, 0)] == 13)
        cap = self.parser.line_cap
        overlong = full_len > cap if cap is not None else np.zeros(n, dtype=bool)
        special |= overlong
        empty = (ends == starts) & ~overlong  # blank line: no record
        if first_is_file_start:  # a BOM, a header or a wrong header: the per-line parser decides
            special[0] = self.parser.first_line_is_special(data[starts[0] : ends[0]])
        if not _utf8_ok(data):
            special |= ~empty
        if self.format == "tsv":
            good, batches = self._tsv_block(data, arr, starts, ends, special, empty)
        else:
            good, batches = self._jsonl_block(data, arr, starts, ends, line_end, special, empty)
        yield from batches
        special = ~good & ~empty
        records, bad = [], 0
        for i in np.flatnonzero(special):
            i = int(i)
            raw = b"" if overlong[i] else data[starts[i] : min(line_end[i] + 1, size)]
            out = self.parser.line(raw, bool(overlong[i]), first_is_file_start and i == 0)
            if out is None:
                continue
            if isinstance(out, _Bad):
                if not self.skip:
                    fail(i, out.reason)
                bad += 1
            else:
                records.append(out)
        yield from self._py_batches(records)
        if bad:
            yield bad
        return n

    def _tsv_block(self, data, arr, starts, ends, special, empty):
        """Vectorised tsv: (rows cleared as good records, their batches)."""
        tabs = np.flatnonzero(arr == 9)
        if len(tabs) == 0:
            return np.zeros(len(starts), dtype=bool), []
        k = np.searchsorted(tabs, starts)
        tab = tabs[np.minimum(k, len(tabs) - 1)]
        has_tab = (k < len(tabs)) & (tab < ends)
        vstart = tab + 1
        ok = has_tab & ~special & ~empty & (tab > starts) & (vstart < ends)
        ok &= ~_WS_LEAD[arr[np.minimum(vstart, len(arr) - 1)]]
        p = self.parser
        if not p.allow_newlines:
            crs = np.flatnonzero(arr == 13)
            if len(crs):
                ok &= np.searchsorted(crs, ends) == np.searchsorted(crs, vstart)
        if not p.allow_tabs:  # no second TAB: the value holds none
            ok &= np.searchsorted(tabs, ends) == np.searchsorted(tabs, vstart)
        if p.max_len is not None:
            ok &= ends - vstart <= p.max_len  # bytes >= characters
        rows = np.flatnonzero(ok)
        if len(rows) == 0:
            return ok, []
        offsets = np.empty(4 * len(rows), dtype=np.int64)
        offsets[0::4] = starts[rows]
        offsets[1::4] = tab[rows]
        offsets[2::4] = vstart[rows]
        offsets[3::4] = ends[rows]
        # users and values are every 4th element of one array over the block: user, TAB, value, gap
        if len(data) < 2**31 - 1:
            segments = pa.StringArray.from_buffers(
                len(offsets) - 1, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)
            )
        else:
            segments = pa.LargeStringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets), pa.py_buffer(data))
        batches = []
        for a in range(0, len(rows), self.batch_rows):
            idx = np.arange(a, min(a + self.batch_rows, len(rows)), dtype=np.int64) * 4
            users = segments.take(pa.array(idx)).cast(pa.string())
            values = segments.take(pa.array(idx + 2)).cast(pa.string())
            batches.append(pa.RecordBatch.from_arrays([users, values], schema=self.schema))
        return ok, batches

    def _jsonl_block(self, data, arr, starts, ends, line_end, special, empty):
        """Vectorised jsonl via pyarrow.json: (rows cleared as good records, their batches)."""
        import pyarrow.json as pj

        n = len(starts)
        cand = ~special & ~empty & (arr[starts] == ord("{")) & (arr[np.maximum(ends - 1, 0)] == ord("}"))
        for word in _JSON_LENIENT:
            at = data.find(word)
            while at >= 0:
                cand[np.searchsorted(starts, at, side="right") - 1] = False
                at = data.find(word, at + 1)
        good = np.zeros(n, dtype=bool)
        if not cand.any():
            return good, []
        buf = data
        if (~cand & ~empty).any():  # blank out the other lines (pyarrow skips whitespace-only lines)
            delta = np.zeros(len(arr) + 1, dtype=np.int32)
            other = np.flatnonzero(~cand & ~empty)
            np.add.at(delta, starts[other], 1)
            np.add.at(delta, line_end[other], -1)
            blank = np.cumsum(delta[:-1]) > 0
            copy_ = arr.copy()
            copy_[blank] = 32
            buf = copy_.tobytes()
        p = self.parser
        schema_str = pa.schema([(p.user_col, pa.string()), (p.value_col, pa.string())])
        schema_int = pa.schema([(p.user_col, pa.int64()), (p.value_col, pa.string())])
        cuts = np.searchsorted(starts, np.arange(_JSON_PIECE_BYTES, len(arr), _JSON_PIECE_BYTES))
        bounds = [0, *sorted(set(int(c) for c in cuts if 0 < c < n)), n]
        batches = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            lines = np.flatnonzero(cand[a:b]) + a
            if len(lines) == 0:
                continue
            lo = int(starts[a])
            hi = int(starts[b]) if b < n else len(arr)
            table = None
            for schema in (schema_str, schema_int):
                try:
                    table = pj.read_json(
                        pa.BufferReader(pa.py_buffer(buf)[lo:hi]),
                        read_options=pj.ReadOptions(use_threads=False, block_size=max(hi - lo, 1 << 16) + 1),
                        parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
                    )
                    break
                except pa.ArrowInvalid as e:
                    if schema is schema_int or f"Column(/{p.user_col}) changed from string to number" not in str(e):
                        break
            if table is None or table.num_rows != len(lines):
                continue  # these lines go to the per-line parser
            users = table.column(0).combine_chunks()
            values = table.column(1).combine_chunks()
            ok = ~np.asarray(values.is_null())
            if pa.types.is_integer(users.type):
                ok &= ~np.asarray(users.is_null())
                users = users.cast(pa.string())
            else:
                u_off, _ = _string_parts(users)
                ok &= ~np.asarray(users.is_null()) & (np.diff(u_off) > 0)
            v_off, v_data = _string_parts(values)
            v_len = np.diff(v_off)
            ok &= v_len > 0
            if len(v_data):
                ok &= ~_WS_LEAD[v_data[np.minimum(v_off[:-1], len(v_data) - 1)]]
            if p.forbidden_bytes:
                ok &= ~_rows_containing(v_off, v_data, p.forbidden_bytes)
            if p.max_len is not None:
                ok &= v_len <= p.max_len
            good[lines[ok]] = True
            keep = pa.array(np.flatnonzero(ok))
            if len(keep):
                batches.extend(self._batches(users.take(keep), values.take(keep)))
        return good, batches

    # -- parquet --------------------------------------------------------------------------------

    def _parquet(self, piece: _Piece):
        path = piece.path
        p = self.parser
        with _parquet_file(path) as pf:
            names = pf.schema_arrow.names
            for col in (p.user_col, p.value_col):
                if col not in names:
                    raise BadRecordError(f"{path}: no column {col!r} (columns: {', '.join(names)})")
            groups = list(range(piece.start, piece.end))
            if not groups:
                return
            row = piece.row_offset
            for batch in _parquet_batches(
                path, pf, batch_size=self.batch_rows, row_groups=groups, columns=[p.user_col, p.value_col]
            ):
                yield from self._parquet_batch(piece, row, batch.column(0), batch.column(1))
                row += batch.num_rows

    def _parquet_batch(self, piece, row0, raw_users, raw_values):
        n = len(raw_users)
        users, values = _as_string_column(raw_users), _as_string_column(raw_values)
        ok = np.zeros(n, dtype=bool)
        if users is not None and values is not None and n:
            u_off, _ = _string_parts(users)
            v_off, v_data = _string_parts(values)
            v_len = np.diff(v_off)
            ok = ~np.asarray(users.is_null()) & ~np.asarray(values.is_null()) & (np.diff(u_off) > 0) & (v_len > 0)
            if len(v_data):
                ok &= ~_WS_LEAD[v_data[np.minimum(v_off[:-1], len(v_data) - 1)]]
            if self.parser.forbidden_bytes:
                ok &= ~_rows_containing(v_off, v_data, self.parser.forbidden_bytes)
            if self.parser.max_len is not None:
                ok &= v_len <= self.parser.max_len
            keep = pa.array(np.flatnonzero(ok))
            if len(keep):
                yield from self._batches(users.take(keep), values.take(keep))
        records, bad = [], 0
        for i in np.flatnonzero(~ok):
            i = int(i)
            out = self.parser.row(raw_users[i].as_py(), raw_values[i].as_py())
            if isinstance(out, _Bad):
                if not self.skip:
                    self._fail(piece, row0 + i, out.reason)
                bad += 1
            else:
                records.append(out)
        yield from self._py_batches(records)
        if bad:
            yield bad


def _as_string_column(array: pa.Array) -> Optional[pa.Array]:
    """A string column as ``pa.string`` (integers as their decimal text), or None for other types."""
    if pa.types.is_string(array.type):
        return array
    if pa.types.is_large_string(array.type) or pa.types.is_integer(array.type):
        return array.cast(pa.string())
    return None


class _ReadPiecesFn(beam.DoFn):
    """_Piece -> Arrow batches; the piece's number of skipped bad records to the 'bad' output."""

    BAD = "bad"

    def __init__(self, reader: _BatchReader):
        self._reader = reader

    def process(self, piece):
        bad = 0
        for out in self._reader.read(piece):
            if isinstance(out, int):
                bad += out
            else:
                yield out
        if bad:
            yield beam.pvalue.TaggedOutput(self.BAD, bad)


class ReadRecordBatches(beam.PTransform):
    """Reads (user, value) records as Arrow record batches, with the rules of :class:`ReadRecords`.

    Returns ``result.records``: a PCollection of ``pyarrow.RecordBatch`` with two non-null
    ``pa.string()`` columns, ``"user"`` and ``value_name``, at most ``batch_rows`` rows each, every
    batch holding only its own buffers (cheap to pickle); and ``result.bad``: per work item with
    skipped bad records, their number (sum them; nothing when none is skipped).

    The records (as a multiset), the skip counts and the error of the first bad record of a file
    (``BadRecordError: FILE:LINE: reason``, parquet ``FILE:row N``) are those of
    :class:`ReadRecords`. Uncompressed tsv/jsonl files are split into byte ranges of
    ``block_bytes`` (a line belongs to the range where it starts), read by separate work items;
    each range is checked with numpy/Arrow over blocks of whole lines (UTF-8, line lengths, TABs,
    empty users, values that start with whitespace, line breaks, lengths; jsonl through
    ``pyarrow.json``) and only the lines a check cannot clear go through the per-line parser of
    :class:`ParseFileFn`. Compressed files (.gz, .bz2, ...) are one work item each, streamed in
    blocks. Parquet files are split into runs of row groups of about ``block_bytes``.
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
        value_name: str = "item",
        batch_rows: int = DEFAULT_BATCH_ROWS,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        label=None,
        allow_tabs: Optional[bool] = None,
    ):
        super().__init__(label)
        if input_format not in INPUT_FORMATS:
            raise ValueError(f"input_format must be one of {', '.join(INPUT_FORMATS)}, got {input_format!r}")
        _check_max_value_length(max_value_length, value_name)
        for name, v in (("batch_rows", batch_rows), ("block_bytes", block_bytes)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        self._pattern = file_pattern
        self._format = input_format
        self._block_bytes = block_bytes
        self._reader = _BatchReader(
            input_format,
            user_column,
            value_column,
            skip_bad_records,
            allow_newlines,
            max_value_length,
            value_name,
            batch_rows,
            block_bytes,
            allow_tabs,
        )

    def expand(self, pbegin):
        return (
            pbegin
            | "MatchFiles"
            >> fileio.MatchFiles(
                self._pattern, empty_match_treatment=fileio.EmptyMatchTreatment.DISALLOW
            )  # FileMetadata (fails if nothing matches)
            | "SplitFiles" >> beam.FlatMap(_split_file, self._format, self._block_bytes)  # _Piece
            | "SpreadPieces" >> beam.Reshuffle()  # _Piece, one per work item
            | "Parse" >> beam.ParDo(_ReadPiecesFn(self._reader)).with_outputs(_ReadPiecesFn.BAD, main="records")
        )  # records: pa.RecordBatch (user, value); bad: skipped records per work item


class RecordsRead(NamedTuple):
    """What the pipelines consume from a reader: ``records`` ((user, value) elements) and ``bad``
    (numbers of skipped bad records, to be summed)."""

    records: beam.PCollection
    bad: beam.PCollection


def batch_records(batch):
    """One batch of :class:`ReadRecordBatches` -> its ``(user, value)`` records."""
    return zip(batch.column(0).to_pylist(), batch.column(1).to_pylist())


# ---------------------------------------------------------------------------------------------
# Public n-gram counts (the Bayesian prior): read by the launcher, bounded and public
# ---------------------------------------------------------------------------------------------


def load_public_counts(path: str, n: int) -> PublicPrior:
    """Reads ``n-gram<TAB>count`` lines (UTF-8, an optional BOM; gzip etc. by extension, verified by
    :func:`open_input`). A directory, or a truncated or corrupt compressed file, raises
    :class:`InputFileError`; a bad line raises ``ValueError`` naming the file and line."""
    counts = {}
    try:
        f = open_input(path)
    except InputFileError:
        raise
    except Exception as e:  # noqa: BLE001  (any filesystem's "not found")
        raise ValueError(f"--public: cannot open {path!r}: {e}") from None
    with f:
        for line_no, (raw, _) in enumerate(read_lines(f, None), 1):
            if line_no == 1 and raw.startswith(_BOM):
                raw = raw[len(_BOM) :]
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


# ---------------------------------------------------------------------------------------------
# The allowlist: public candidate items, read inside the pipeline, verified like the input
# ---------------------------------------------------------------------------------------------

# An allowlist line longer than this is an error (an entry is one item; a longer line is binary data).
ALLOWLIST_LINE_BYTES = 1 << 20


class _MatchAllowlistFn(beam.DoFn):
    """pattern -> the path of every file it matches; :class:`InputFileError` if none matches or one
    is a directory."""

    def process(self, pattern):
        matches = FileSystems.match([pattern])[0].metadata_list
        if not matches:
            raise InputFileError(f"allowlist: no file matches {pattern}")
        for metadata in sorted(matches, key=lambda m: m.path):
            check_not_directory(metadata.path)
            yield metadata.path


def allowlist_entries(path: str):
    """The items of one allowlist file: one per line (UTF-8, an optional BOM, LF or CRLF; blank lines
    are no entry). A truncated/corrupt compressed file, a NUL byte (binary data), invalid UTF-8 or a
    line longer than :data:`ALLOWLIST_LINE_BYTES` raises :class:`InputFileError` ``FILE[:LINE]: ...``."""
    with open_input(path) as f:
        for line_no, (data, overlong) in enumerate(read_lines(f, ALLOWLIST_LINE_BYTES), 1):
            where = f"{path}:{line_no}"
            if overlong:
                raise InputFileError(
                    f"{where}: line longer than {ALLOWLIST_LINE_BYTES} bytes (one item per line; binary data?)"
                )
            if line_no == 1 and data.startswith(_BOM):
                data = data[len(_BOM) :]
            if b"\0" in data:
                raise InputFileError(
                    f"{where}: binary data (a NUL byte; an allowlist is UTF-8 text, one item per line)"
                )
            try:
                line = data.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputFileError(f"{where}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
            item = line.rstrip("\n").rstrip("\r")
            if item:
                yield item


def check_allowlist_not_empty(count: int, pattern: str) -> int:
    if count == 0:
        raise EmptyInputError(
            f"allowlist: no entries in {pattern} (the files are empty or hold only blank lines; an empty "
            "allowlist would release nothing)"
        )
    return count


def _one(_) -> int:
    return 1


def read_allowlist(pipeline: beam.Pipeline, path: str):
    """The allowlist file(s) as a PCollection of items (:func:`allowlist_entries` of every file
    ``path`` matches). The run fails with :class:`InputFileError` if no file matches
    (``allowlist: no file matches PATH``), a match is a directory or a file is damaged, and with
    :class:`EmptyInputError` (``allowlist: no entries in PATH ...``) if the files hold no entry."""
    items = (
        pipeline
        | "AllowlistPattern" >> beam.Create([path])  # the pattern
        | "MatchAllowlist" >> beam.ParDo(_MatchAllowlistFn())  # path of a matching file
        | "SpreadAllowlistFiles" >> beam.Reshuffle()  # path, one file per work item
        | "ReadAllowlist" >> beam.FlatMap(allowlist_entries)  # item
    )
    _ = (
        items
        | "AllowlistOnes" >> beam.Map(_one)  # 1 per entry
        | "CountAllowlist" >> beam.CombineGlobally(sum)  # number of entries (public)
        | "CheckAllowlistNotEmpty" >> beam.Map(check_allowlist_not_empty, path)  # fails on 0
    )
    return items
