"""Rebuild every bundled data file from the Debian changelog corpus ``debian_b`` (deterministic).

    python data/build_samples.py --source ../shared/data      # from the repository root
    python data/build_samples.py [--source DIR] [--out DIR] [--stats-only]

Reads only ``debian_b.jsonl.gz``, ``debian_b.user_words.tsv.gz`` and ``debian_b_packages.txt`` of
the source folder (Debian 12 changelog entries taken from Debian's package archive; provenance and
licence in ``data/README.md``) and writes:

``debian_words.tsv.gz``
    the ``select_partitions`` demo input: header ``user<TAB>item``, then every distinct (user, word)
    pair of ALL 1,754 users of ``debian_b.user_words.tsv.gz``, sorted by user then word.
``debian_text.jsonl.gz``
    the private sample of the ``extract_ngrams`` (DPNE) and ``bayesian_ngrams`` demos: the lines of
    ``debian_b.jsonl.gz`` (``{"user", "text"}``, copied byte for byte) of ``PRIVATE_USERS`` users
    drawn with ``random.Random(SEED).sample`` from the sorted user ids, sorted by user.
``bayesian_public_trigrams.tsv.gz``
    the public prior of the ``bayesian_ngrams`` demo: ``trigram<TAB>count``, the ``TOP_TRIGRAMS``
    most frequent trigrams (occurrences; ties broken by the trigram string), sorted by trigram, of
    the users that are NOT in the private sample (so the prior is public relative to it), counted
    with the package's tokenizer (``dp_partition_beam.transforms.core.text.default_tokenize``) within lines: a trigram
    never crosses a line break.
``debian_b_packages.txt``
    the 2,500 Debian source packages the corpus was built from (copied unchanged): which packages'
    licences the excerpts fall under.

Every rebuild gives byte-identical files: fixed seed and orders, gzip with mtime 0, level 9 and the
file's own name in the header (``tests/data/test_bundled_data.py`` checks it). The statistics printed at
the end (``--stats-only`` prints them without writing) are the table of ``data/README.md``.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import hashlib
import io
import json
import os
import random
import sys
from typing import Dict, List

from dp_partition_beam.transforms.core.text import default_tokenize, segments  # the package's own tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
from benchmarks.shared_data import shared_data_path  # noqa: E402

SOURCE_TEXT = "debian_b.jsonl.gz"
SOURCE_WORDS = "debian_b.user_words.tsv.gz"
SOURCE_PACKAGES = "debian_b_packages.txt"

SEED = 20261122  # random.Random(SEED).sample over the sorted user ids
PRIVATE_USERS = 1000  # of 1,754: the rest (754) build the public prior
TOP_TRIGRAMS = 5000  # public vocabulary size (as the previous bundled prior)

WORDS_FILE = "debian_words.tsv.gz"
TEXT_FILE = "debian_text.jsonl.gz"
TRIGRAMS_FILE = "bayesian_public_trigrams.tsv.gz"
PACKAGES_FILE = "debian_b_packages.txt"
OUTPUTS = (WORDS_FILE, TEXT_FILE, TRIGRAMS_FILE, PACKAGES_FILE)


def gzip_bytes(name: str, text: str) -> bytes:
    """``text`` (UTF-8) gzip-compressed reproducibly: level 9, mtime 0, ``name`` minus .gz as file name."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename=name[: -len(".gz")], mode="wb", compresslevel=9, fileobj=buf, mtime=0) as f:
        f.write(text.encode("utf-8"))
    return buf.getvalue()


def _source(source: str, name: str) -> str:
    path = os.path.join(source, name)
    if not os.path.exists(path):
        raise SystemExit(
            f"error: {path} not found: pass --source, the folder holding {SOURCE_TEXT}, "
            f"{SOURCE_WORDS} and {SOURCE_PACKAGES} (default ../shared/data next to the repository)"
        )
    return path


def read_text_lines(source: str) -> Dict[str, str]:
    """user -> the raw JSON line of debian_b.jsonl.gz (without its newline); users must be unique."""
    out: Dict[str, str] = {}
    with gzip.open(_source(source, SOURCE_TEXT), "rt", encoding="utf-8", newline="\n") as f:
        for line_no, line in enumerate(f, 1):
            line = line.rstrip("\n")
            rec = json.loads(line)
            if set(rec) != {"user", "text"} or rec["user"] in out:
                raise SystemExit(f'error: {SOURCE_TEXT}:{line_no}: expected one {{"user", "text"}} line per user')
            out[rec["user"]] = line
    return out


def read_pairs(source: str) -> List[tuple]:
    with gzip.open(_source(source, SOURCE_WORDS), "rt", encoding="utf-8", newline="\n") as f:
        header = next(f).rstrip("\n")
        if header != "user\tword":
            raise SystemExit(f"error: {SOURCE_WORDS}: header {header!r}, expected 'user<TAB>word'")
        return [tuple(line.rstrip("\n").split("\t", 1)) for line in f]


def split_users(users: List[str]):
    """(private, public): sorted lists; private = random.Random(SEED).sample(sorted users, PRIVATE_USERS)."""
    users = sorted(users)
    private = set(random.Random(SEED).sample(users, PRIVATE_USERS))
    return sorted(private), [u for u in users if u not in private]


def trigram_counts(texts: List[str]) -> collections.Counter:
    """Occurrences of each trigram (words joined by one space) in the texts, within lines."""
    counts: collections.Counter = collections.Counter()
    for text in texts:
        for seg in segments(text):
            toks = default_tokenize(seg)
            counts.update(" ".join(toks[i : i + 3]) for i in range(len(toks) - 2))
    return counts


def text_stats(texts: List[str]) -> dict:
    """Text lines, word tokens, distinct words and distinct trigrams (within lines) of the texts."""
    words: collections.Counter = collections.Counter()
    n_lines = 0
    for text in texts:
        for seg in segments(text):
            n_lines += 1
            words.update(default_tokenize(seg))
    return dict(
        text_lines=n_lines,
        tokens=sum(words.values()),
        distinct_words=len(words),
        distinct_trigrams=len(trigram_counts(texts)),
    )


def build(source: str) -> tuple:
    """({file name: bytes}, {file name: stats dict}) of every bundled file."""
    lines = read_text_lines(source)
    pairs = read_pairs(source)
    users = sorted(lines)
    unknown = {u for u, _ in pairs} - set(lines)
    if unknown:
        raise SystemExit(f"error: {SOURCE_WORDS} has {len(unknown)} users that are not in {SOURCE_TEXT}")
    private, public = split_users(users)
    files, stats = {}, {}

    distinct_pairs = sorted(set(pairs))
    files[WORDS_FILE] = gzip_bytes(WORDS_FILE, "user\titem\n" + "".join(f"{u}\t{w}\n" for u, w in distinct_pairs))
    stats[WORDS_FILE] = dict(
        users=len({u for u, _ in distinct_pairs}),
        records=len(distinct_pairs),
        distinct_words=len({w for _, w in distinct_pairs}),
    )

    files[TEXT_FILE] = gzip_bytes(TEXT_FILE, "".join(lines[u] + "\n" for u in private))
    stats[TEXT_FILE] = dict(
        users=len(private), records=len(private), **text_stats([json.loads(lines[u])["text"] for u in private])
    )

    public_texts = [json.loads(lines[u])["text"] for u in public]
    counts = trigram_counts(public_texts)
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_TRIGRAMS]
    files[TRIGRAMS_FILE] = gzip_bytes(TRIGRAMS_FILE, "".join(f"{g}\t{c}\n" for g, c in sorted(top)))
    stats[TRIGRAMS_FILE] = dict(
        users=len(public),
        records=len(top),
        **text_stats(public_texts),
        counts=(min(c for _, c in top), max(c for _, c in top)),
        occurrences=(sum(c for _, c in top), sum(counts.values())),
    )

    with open(_source(source, SOURCE_PACKAGES), "rb") as f:
        files[PACKAGES_FILE] = f.read()
    stats[PACKAGES_FILE] = dict(records=files[PACKAGES_FILE].count(b"\n"))
    for name, data in files.items():
        stats[name].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    return files, stats


COLUMNS = (
    ("bytes", "bytes"),
    ("users", "users"),
    ("records", "records"),
    ("text_lines", "text lines"),
    ("tokens", "word tokens"),
    ("distinct_words", "distinct words"),
    ("distinct_trigrams", "distinct trigrams"),
)


def stats_markdown(stats: dict) -> str:
    """The statistics table of data/README.md (exactly what this script prints)."""
    rows = ["| file | " + " | ".join(label for _, label in COLUMNS) + " |", "|---|" + "---:|" * len(COLUMNS)]
    for name in OUTPUTS:
        s = stats[name]
        rows.append(
            f"| `{name}` | " + " | ".join("-" if s.get(key) is None else f"{s[key]:,}" for key, _ in COLUMNS) + " |"
        )
    t = stats[TRIGRAMS_FILE]
    rows += [
        "",
        f"Records: `{WORDS_FILE}` one distinct (user, word) pair each; `{TEXT_FILE}` one user each; "
        f"`{TRIGRAMS_FILE}` one trigram each, the {t['records']:,} most frequent of the {t['distinct_trigrams']:,} "
        f"distinct trigrams of its {t['users']:,} users (counts {t['counts'][0]:,} to {t['counts'][1]:,}: "
        f"{t['occurrences'][0]:,} of their {t['occurrences'][1]:,} trigram occurrences); `{PACKAGES_FILE}` one "
        f"source package each. The text columns are over the users' `text` (lines of text = changelog items), "
        f"tokenised with `dp_partition_beam.transforms.core.text.default_tokenize`, trigrams within lines.",
    ]
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--source",
        help="folder with debian_b.* (default: $DP_SHARED_DATA, else ../shared/data "
        "next to the repository root; benchmarks/shared_data.py)",
    )
    ap.add_argument("--out", default=os.path.join(REPO, "data"), help="where to write (default: data/)")
    ap.add_argument("--stats-only", action="store_true", help="print the statistics, write nothing")
    args = ap.parse_args(argv)
    source = args.source or os.path.dirname(shared_data_path(SOURCE_TEXT))
    files, stats = build(source)
    if not args.stats_only:
        os.makedirs(args.out, exist_ok=True)
        for name, data in files.items():
            with open(os.path.join(args.out, name), "wb") as f:
                f.write(data)
            print(f"wrote {os.path.join(args.out, name)} ({len(data):,} bytes, sha256 {stats[name]['sha256'][:16]})")
    print(
        f"\nseed {SEED}: {stats[TEXT_FILE]['users']:,} private users ({TEXT_FILE}), "
        f"{stats[TRIGRAMS_FILE]['users']:,} public users ({TRIGRAMS_FILE}), disjoint\n"
    )
    print(stats_markdown(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
