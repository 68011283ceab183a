"""DPNE's columnar path: vectorised tokenisation and n-grams == the per-line code; seeded Beam DPNE ==
the reference whatever the batch size, the shard count and the input form (elements, Arrow batches)."""

import random

import apache_beam as beam
import pyarrow as pa
import pytest

from dp_partition_beam.privacy.dpne import DPNEParams
from dp_partition_beam.transforms.core import text as tx
from dp_partition_beam.transforms.dpne import dpne_kernels
from dp_partition_beam.transforms.dpne import dpne_kernels as CK
from dp_partition_beam.transforms.dpne.dpne import DPNE
from dp_partition_beam.transforms.dpne.reference import dpne_reference
from dp_partition_beam.transforms.testing.synthetic import markov_corpus

from tests.support.beam_helpers import collect

SEED = 31

ASCII = list("aZb_9' \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f.,-") + ["\r\n", "''", "don't", "A'B"]
UNICODE = ASCII + ["é", "\u2019", "İ", "\u2028", "\x85", "ﬁ", "Ⅻ", "ß"]


def _pairs(table):
    return {
        (u.decode(), g.decode()) for u, g in zip(table.column("user").to_pylist(), table.column("item").to_pylist())
    }


@pytest.mark.parametrize("alphabet", [ASCII, UNICODE], ids=["ascii", "unicode"])
def test_tokens_and_ngrams_equal_the_per_line_tokenizer(alphabet):
    rnd = random.Random(len(alphabet))
    for _ in range(150):
        texts = ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 40))) for _ in range(rnd.randint(1, 25))]
        users = [f"u{rnd.randint(0, 4)}" for _ in texts]
        tokens = CK.tokenize_table(CK.texts_table(users, texts))
        for k in (1, 2, 3):
            want = {(u, g) for u, t in zip(users, texts) for g in tx.text_kgrams(t, k)}
            assert _pairs(CK.level_pairs(tokens, [k])) == want, (texts, k)


def test_custom_tokenizer_is_applied_per_line():
    texts = ["A-B c\nd E", "x"]
    tokens = CK.tokenize_table(CK.texts_table(["u", "v"], texts), str.split)
    assert _pairs(CK.level_pairs(tokens, [2])) == {("u", "A-B c"), ("u", "d E")}


def test_pruned_level_equals_is_valid():
    recs = markov_corpus(200, vocab=12, branching=3, seed=2)
    records = [(u, "\n".join(lines)) for u, lines in recs.items()]
    tokens = CK.tokenize_table(CK.texts_table(*zip(*records)))
    rnd = random.Random(0)
    for k in (2, 3):
        all_prev = sorted({g for _, t in records for g in tx.text_kgrams(t, k - 1)})
        s_prev = set(rnd.sample(all_prev, len(all_prev) // 2))
        words = sorted({g for _, t in records for g in tx.text_kgrams(t, 1)})
        s1 = set(rnd.sample(words, len(words) - 2))
        for pruning in ("both", "single"):
            got = _pairs(
                CK.level_pairs(tokens, [k], CK.string_array(sorted(s_prev)), CK.string_array(sorted(s1)), pruning)
            )
            want = {
                (u, g)
                for u, t in records
                for g in tx.text_kgrams(t, k)
                if dpne_kernels.is_valid(g, s_prev, s1, pruning)
            }
            assert got == want


def test_chunked_capping_equals_capping_at_once():
    recs = markov_corpus(120, vocab=10, branching=3, seed=5)
    records = [(u, "\n".join(lines)) for u, lines in recs.items()] + [("big", "w1 w2 w3 w1 w2 " * 40)]
    tokens = CK.tokenize_table(CK.texts_table(*zip(*records)))
    rem = tokens.column("rem").to_numpy()
    chunks = CK.line_chunks(rem, 25)
    assert chunks[0][0] == 0 and chunks[-1][1] == len(rem) and all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
    assert all(
        rem[stop - 1] == 0 and (stop - start <= 25 or rem[start:stop].max() == stop - start - 1)
        for start, stop in chunks
    )
    words = CK.string_array(sorted({g for _, t in records for g in tx.text_kgrams(t, 1)}))
    prev = CK.string_array(sorted({g for _, t in records for g in tx.text_kgrams(t, 1)}))
    for lengths, s_prev, s1 in (([1], None, None), ([1, 2, 3], None, None), ([2], prev, words)):
        whole = CK.capped_level(tokens, lengths, 4, SEED, 2, s_prev, s1)
        for chunk_rows in (7, 300):
            got = CK.capped_level(tokens, lengths, 4, SEED, 2, s_prev, s1, chunk_rows=chunk_rows)
            assert sorted(zip(*got.to_pydict().values())) == sorted(zip(*whole.to_pydict().values()))


def test_arrow_batch_columns_are_checked():
    with pytest.raises(ValueError, match="needs columns"):
        CK.normalise_text_batch(pa.table({"user": ["u"], "item": ["a"]}))
    with pytest.raises(ValueError, match="null"):
        CK.normalise_text_batch(pa.table({"user": ["u", None], "text": ["a", "b"]}))
    t = CK.normalise_text_batch(pa.table({"user": pa.array([7]), "text": ["a b"]}))
    assert t.column("user").to_pylist() == [b"7"]  # an integer user is its decimal text (as the readers read it)


@pytest.fixture(scope="module")
def records():
    recs = markov_corpus(250, vocab=25, branching=3, seed=11)
    out = [(u, "\n".join(lines)) for u, lines in recs.items()]
    # a user with many records and a text with many lines (n-grams never cross a line break)
    out += [("heavy", f"w{i % 7} w{(i + 1) % 7} w{(i * 3) % 5}") for i in range(60)]
    out.append(("lines", "\n".join(f"w{i % 5} w{(i + 2) % 5}" for i in range(300))))
    return out


PARAMS = DPNEParams(epsilon=4, delta=1e-5, max_n=4, max_contributions=(15, 10, 10, 5), eta=0.3)


def _run(build_input, params, **options):
    def build(p):
        out = build_input(p) | DPNE("dpne", params, seed=SEED, **options)
        return out["ngrams"]

    return sorted(collect(build, fmt=lambda kg: f"{kg[0]}\t{kg[1]}"))


@pytest.mark.parametrize(
    "options",
    [dict(batch_rows=1, num_shards=1), dict(batch_rows=17, num_shards=3), dict(batch_rows=100_000, rows_per_shard=50)],
    ids=["rows1-shards1", "rows17-shards3", "rows_per_shard50"],
)
def test_seeded_columnar_equals_reference_for_any_batching(records, options, monkeypatch):
    from dp_partition_beam.transforms.core import batches

    monkeypatch.setattr(batches, "DEFAULT_CHUNK_ROWS", 40)  # user shards travel in pieces of a few users
    want = dpne_reference(records, "dpne", PARAMS, seed=SEED).lines()
    assert len(want) > 50
    assert _run(lambda p: p | beam.Create(records) | beam.Reshuffle(), PARAMS, **options) == want


def test_arrow_batches_and_mixed_input_equal_elements(records):
    want = dpne_reference(records, "dpne", PARAMS, seed=SEED).lines()
    users, texts = zip(*records)
    batches = [
        pa.RecordBatch.from_pydict({"user": list(users[i : i + 40]), "text": list(texts[i : i + 40])})
        for i in range(0, len(records) // 2, 40)
    ]
    rest = records[len(batches) * 40 :]

    def build(p):
        return (p | "Batches" >> beam.Create(batches), p | "Elements" >> beam.Create(rest)) | beam.Flatten()

    assert _run(build, PARAMS, batch_rows=25) == want


def test_dpsu_runs_equal_reference_on_batches(records):
    params = DPNEParams(epsilon=4, delta=1e-5, max_n=3, max_contributions=10)
    want = dpne_reference(records, "dpsu_even", params, seed=SEED).lines()
    table = pa.table({"user": [u for u, _ in records], "text": [t for _, t in records]})

    def build(p):
        out = p | beam.Create([table]) | DPNE("dpsu_even", params, seed=SEED, batch_rows=64)
        return out["ngrams"]

    assert sorted(collect(build, fmt=lambda kg: f"{kg[0]}\t{kg[1]}")) == want


def _allowlist(records):
    grams = sorted({g for _, t in records for k in (1, 2, 3) for g in tx.text_kgrams(t, k)})
    return grams[::2]


@pytest.mark.parametrize("weighting", ["weighted_gaussian", "mad"])
def test_allowlist_and_counts_equal_reference(records, weighting):
    params = DPNEParams(
        epsilon=4,
        delta=1e-5,
        max_n=3,
        max_contributions=12,
        eta=0.3,
        weighting=weighting,
        d_max=20,
        release_counts=True,
    )
    allow = _allowlist(records)
    want = dpne_reference(records, "dpne", params, seed=SEED, allowlist=allow)

    def build(p):
        allowed = allow if weighting == "mad" else p | "Allow" >> beam.Create(allow)  # iterable and PCollection
        return (p | beam.Create(records) | DPNE("dpne", params, seed=SEED, allowlist=allowed, num_shards=2))["counts"]

    got = collect(build, fmt=lambda kgc: f"{kgc[0]}\t{kgc[1][0]}\t{kgc[1][1]}")
    assert sorted(got) == sorted(f"{k}\t{g}\t{c}" for k, cs in want.counts.items() for g, c in cs.items())
    # every noise-released n-gram is allowlisted (spurious k-grams are uniform over V_k, as in the reference)
    assert len(got) > 10 and all(line.split("\t")[1] in set(allow) for line in got if line.startswith("1\t"))


def test_entry_batches_are_bounded_in_rows_and_characters():
    from dp_partition_beam.transforms.dpne.dpne import ToTextBatchesFn

    fn = ToTextBatchesFn(4)
    fn.MAX_BATCH_CHARS = 10
    fn.start_bundle()
    out = [t for i in range(9) for t in fn.process((f"u{i}", "abcd"))]  # 4 chars each: flush every 3 records
    assert [t.num_rows for t in out] == [3, 3, 3]
    big = pa.table({"user": [f"u{i}" for i in range(10)], "text": ["x y"] * 10, "other": list(range(10))})
    cut = list(fn.process(big))
    assert [t.num_rows for t in cut] == [4, 4, 2] and all(t.schema.names == ["user", "text"] for t in cut)
