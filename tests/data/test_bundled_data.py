"""The bundled data: documented, rebuilt byte for byte from debian_b, and free of the other corpora.

Reads the shared data folder (``benchmarks/shared_data.py``: ``DP_SHARED_DATA``, else
``../shared/data``) and fails, naming the missing file, if it is absent.
"""

import collections
import gzip
import importlib.util
import json
import os
import re
import subprocess
import sys
import zlib

import pyarrow.json
import pytest

from dp_partition_beam.transforms.core.text import default_tokenize, segments

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(REPO, "data")
README = os.path.join(DATA, "README.md")
HEX_RUN = re.compile(rb"[0-9a-f]{16,}")  # user ids of every shared corpus are 16 lowercase hex digits


def bundled_files():
    """Every file under data/ (relative paths), bytecode caches excepted."""
    out = []
    for root, dirs, files in os.walk(DATA):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        out += [os.path.relpath(os.path.join(root, f), DATA) for f in files]
    return sorted(out)


def readme_files_table():
    """{file: source} from the rows of data/README.md's "Files" table."""
    text = open(README, encoding="utf-8").read()
    section = text[text.index("## Files") :]
    section = section[: section.index("\n## ", 4)]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"^\| `([^`]+)` \| ([^|]*) \|", line)
        if m:
            rows[m.group(1)] = m.group(2).strip()
    return rows


def build_module():
    spec = importlib.util.spec_from_file_location("build_samples", os.path.join(DATA, "build_samples.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def read_bytes(path):
    with open(path, "rb") as f:
        data = f.read()
    return gzip.decompress(data) if path.endswith(".gz") else data


def test_every_bundled_file_is_listed_in_the_readme_with_its_source():
    rows = readme_files_table()
    assert sorted(rows) == bundled_files(), "data/README.md's Files table must list exactly the files under data/"
    for name, source in rows.items():
        if name.endswith((".gz", ".txt")):  # data: built from the Debian corpus, never from another one
            assert source.startswith("`debian_b") and "debian_b" in source, (name, source)
        else:
            assert source == "this repository", (name, source)


def test_readme_statistics_and_command_are_the_build_scripts(shared_data):
    mod = build_module()
    _, stats = mod.build(os.path.dirname(shared_data("debian_b.jsonl.gz")))
    text = open(README, encoding="utf-8").read()
    assert mod.stats_markdown(stats) in text
    assert "data/build_samples.py --source ../shared/data" in text


def test_build_script_rebuilds_every_file_byte_for_byte(shared_data, tmp_path):
    source = os.path.dirname(shared_data("debian_b.jsonl.gz"))
    proc = subprocess.run(
        [sys.executable, os.path.join(DATA, "build_samples.py"), "--source", source, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    built = sorted(os.listdir(tmp_path))
    assert built == [f for f in bundled_files() if f not in ("README.md", "build_samples.py")]
    for name in built:
        with open(tmp_path / name, "rb") as f, open(os.path.join(DATA, name), "rb") as g:
            rebuilt, bundled = f.read(), g.read()
        if rebuilt != bundled and name.endswith(".gz") and gzip.decompress(rebuilt) == gzip.decompress(bundled):
            pytest.fail(
                f"data/{name}: same content, different gzip bytes (zlib {zlib.ZLIB_RUNTIME_VERSION} "
                "compresses differently from the one that built it)"
            )
        assert rebuilt == bundled, f"data/{name} differs from its rebuild: run data/build_samples.py and commit"


def test_private_sample_and_public_prior_come_from_disjoint_users(shared_data):
    """The prior is exactly the top trigrams of the users NOT in debian_text.jsonl.gz (recomputed here
    from the corpus, independently of the build script), and the sample is drawn from the corpus."""
    private = {}
    with gzip.open(os.path.join(DATA, "debian_text.jsonl.gz"), "rt", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            private[r["user"]] = r["text"]
    corpus = {}
    with gzip.open(shared_data("debian_b.jsonl.gz"), "rt", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            corpus[r["user"]] = r["text"]
    assert len(private) == 1000 and all(corpus.get(u) == t for u, t in private.items())
    public = [u for u in corpus if u not in private]
    assert len(public) == len(corpus) - len(private) > 0
    counts = collections.Counter()
    for u in public:
        for seg in segments(corpus[u]):
            toks = default_tokenize(seg)
            counts.update(" ".join(toks[i : i + 3]) for i in range(len(toks) - 2))
    want = sorted(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:5000])
    with gzip.open(os.path.join(DATA, "bayesian_public_trigrams.tsv.gz"), "rt", encoding="utf-8") as f:
        got = [(g, int(c)) for g, c in (line.rstrip("\n").split("\t") for line in f)]
    assert got == want
    # and a prior that also counted the private users would differ (the check above can fail)
    for u in private:
        for seg in segments(private[u]):
            toks = default_tokenize(seg)
            counts.update(" ".join(toks[i : i + 3]) for i in range(len(toks) - 2))
    assert sorted(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:5000]) != got


def _ids(path):
    """User ids (first field) of a jsonl or user<TAB>word .gz file of the shared data."""
    ids = set()
    if path.endswith(".jsonl.gz"):
        # pyarrow's JSON reader: the same "user" strings as json.loads line by line (checked equal on
        # msnbc's 989,818 ids), in ~1/3 of the CPU
        return {u.encode() for u in pyarrow.json.read_json(path).column("user").to_pylist()}
    with gzip.open(path, "rb") as f:
        next(f)  # header
        for line in f:
            ids.add(line[: line.index(b"\t")])
    return ids


def _hex_windows(data):
    """Every 16-character window of every maximal run of >= 16 hex digits (lowercased) in ``data``:
    a 16-hex-digit id occurs anywhere in ``data`` iff it is one of these."""
    out = set()
    for m in HEX_RUN.finditer(data.lower()):
        run = m.group()
        out.update(run[i : i + 16] for i in range(len(run) - 15))
    return out


def tracked_files():
    """data/ plus every file git tracks (if this is a git checkout), as absolute paths."""
    paths = {os.path.join(DATA, f) for f in bundled_files()}
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return sorted(paths)
    paths |= {os.path.join(REPO, p) for p in listed.decode().split("\0") if p and os.path.isfile(os.path.join(REPO, p))}
    return sorted(paths)


@pytest.mark.parametrize("corpus", ["commits", "msnbc"])
def test_no_user_id_of_the_public_repository_corpora_is_bundled(shared_data, corpus):
    ids = _ids(shared_data(f"{corpus}.jsonl.gz")) | _ids(shared_data(f"{corpus}.user_words.tsv.gz"))
    assert len(ids) > 20_000 and all(len(i) == 16 for i in ids)
    found = {}
    for path in tracked_files():
        hits = _hex_windows(read_bytes(path)) & ids
        if hits:
            found[os.path.relpath(path, REPO)] = sorted(hits)[:3]
    assert not found, f"user ids of {corpus} in the repository: {found}"


def test_the_id_scan_finds_ids_that_are_there(shared_data):
    """The scan is not vacuous: it finds every debian_b id in the bundled Debian files, including ids
    embedded in longer hex runs and in upper case."""
    ids = _ids(shared_data("debian_b.jsonl.gz"))
    assert _hex_windows(read_bytes(os.path.join(DATA, "debian_words.tsv.gz"))) & ids == ids
    some = sorted(ids)[0]
    assert some in _hex_windows(b"x" + b"ab12" + some.upper() + b"ff y")


def test_words_file_is_the_package_tokenizer_applied_to_the_text():
    """For the sample's users, debian_words.tsv.gz holds exactly the words default_tokenize finds in
    debian_text.jsonl.gz: the select_partitions and DPNE demos see the same words."""
    tokenized = set()
    with gzip.open(os.path.join(DATA, "debian_text.jsonl.gz"), "rt", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            tokenized.update((r["user"], w) for seg in segments(r["text"]) for w in default_tokenize(seg))
    users = {u for u, _ in tokenized}
    with gzip.open(os.path.join(DATA, "debian_words.tsv.gz"), "rt", encoding="utf-8", newline="\n") as f:
        assert next(f) == "user\titem\n"
        listed = {tuple(line.rstrip("\n").split("\t", 1)) for line in f}
    assert len(users) == 1000 and {p for p in listed if p[0] in users} == tokenized
