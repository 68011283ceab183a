"""DPNE's columnar path: vectorised tokenisation and n-grams == the per-line code; seeded Beam DPNE ==
the reference whatever the batch size, the shard count and the input form (elements, Arrow batches)."""

import random

import apache_beam as beam
import pyarrow as pa
import pytest

from dp_partition_beam.privacy.dpne import DPNEParams
from dp_partition_beam.transforms.core import batches as batches_module
from dp_partition_beam.transforms.core import text as tx
from dp_partition_beam.transforms.dpne import dpne_kernels
from dp_partition_beam.transforms.dpne import dpne_kernels as CK
from dp_partition_beam.transforms.dpne.dpne import DPNE
from dp_partition_beam.transforms.dpne.reference import dpne_reference
from dp_partition_beam.transforms.testing.synthetic import markov_corpus

from tests.support.beam_helpers import collect_branches
from tests.support.dpne_cases import branch, level_key, outputs, untag

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
    recs = markov_corpus(120, vocab=25, branching=3, seed=11)
    out = [(u, "\n".join(lines)) for u, lines in recs.items()]
    # a user with many records and a text with many lines (n-grams never cross a line break)
    out += [("heavy", f"w{i % 7} w{(i + 1) % 7} w{(i * 3) % 5}") for i in range(60)]
    out.append(("lines", "\n".join(f"w{i % 5} w{(i + 2) % 5}" for i in range(300))))
    return out


# max_n=3 (was 4): level 3 is the first whose pruning reads S_{k-1} != S_1; a level 4 runs the same stages
# again in each of the five branches with PARAMS, a third more graph each (a DPNE branch's cost is its graph)
PARAMS = DPNEParams(epsilon=4, delta=1e-5, max_n=3, max_contributions=(15, 10, 5), eta=0.3)
DPSU = DPNEParams(epsilon=4, delta=1e-5, max_n=3, max_contributions=10)
# the DPNE pieces travel in (batches.DEFAULT_CHUNK_ROWS, patched for the whole pipeline): a few users each
CHUNK_ROWS = 40
BATCHINGS = {
    "rows1-shards1": dict(batch_rows=1, num_shards=1),
    "rows17-shards3": dict(batch_rows=17, num_shards=3),
    "rows_per_shard50": dict(batch_rows=100_000, rows_per_shard=50),
}
WEIGHTINGS = ("weighted_gaussian", "mad")
OUTPUTS = ("ngrams", "levels")


def _allowlist(records):
    grams = sorted({g for _, t in records for k in (1, 2, 3) for g in tx.text_kgrams(t, k)})
    return grams[::2]


def _counts_params(weighting):
    return DPNEParams(
        epsilon=4,
        delta=1e-5,
        max_n=3,
        max_contributions=12,
        eta=0.3,
        weighting=weighting,
        d_max=20,
        release_counts=True,
    )


@pytest.fixture(scope="module")
def want(records):
    """Every case's reference, computed once."""
    allow = _allowlist(records)
    out = {"dpne": dpne_reference(records, "dpne", PARAMS, seed=SEED), "allow": allow}
    out["dpsu"] = dpne_reference(records, "dpsu_even", DPSU, seed=SEED)
    for w in WEIGHTINGS:
        out[f"allow-{w}"] = dpne_reference(records, "dpne", _counts_params(w), seed=SEED, allowlist=allow)
    return out


@pytest.fixture(scope="module")
def got(records, want):
    """Every batching, input form and option of this file as a labelled branch of ONE seeded pipeline
    (``{case: {output: sorted lines}}``); each test below compares one branch with its own reference."""
    users, texts = zip(*records)
    batches = [
        pa.RecordBatch.from_pydict({"user": list(users[i : i + 40]), "text": list(texts[i : i + 40])})
        for i in range(0, len(records) // 2, 40)
    ]
    rest = records[len(batches) * 40 :]
    table = pa.table({"user": list(users), "text": list(texts)})
    allow = want["allow"]

    def elements(p):
        return p | "Create" >> beam.Create(records) | "Reshuffle" >> beam.Reshuffle()

    def dpne(build_input, params, names=OUTPUTS, **options):
        return branch(lambda p: outputs(build_input(p) | "DPNE" >> DPNE("dpne", params, seed=SEED, **options), names))

    builds = {name: dpne(elements, PARAMS, **options) for name, options in BATCHINGS.items()}
    builds["arrow-and-elements"] = dpne(
        lambda p: (p | "Batches" >> beam.Create(batches), p | "Elements" >> beam.Create(rest)) | beam.Flatten(),
        PARAMS,
        batch_rows=25,
    )
    builds["dpsu-table"] = branch(
        lambda p: outputs(
            p | "Create" >> beam.Create([table]) | "DPNE" >> DPNE("dpsu_even", DPSU, seed=SEED, batch_rows=64)
        )
    )
    for w in WEIGHTINGS:
        builds[f"allow-{w}"] = branch(
            lambda p, w=w: outputs(
                p
                | "Create" >> beam.Create(records)
                | "DPNE"
                >> DPNE(
                    "dpne",
                    _counts_params(w),
                    seed=SEED,
                    # an iterable allowlist and a PCollection one
                    allowlist=allow if w == "mad" else p | "Allow" >> beam.Create(allow),
                    num_shards=2,
                ),
                ("counts",),
            )
        )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(batches_module, "DEFAULT_CHUNK_ROWS", CHUNK_ROWS)
        lines = collect_branches(builds)
    return {name: untag(lines[name], ("counts",) if name.startswith("allow") else OUTPUTS) for name in lines}


def test_the_data_exercises_every_level_several_batches_shards_and_pieces(records, want):
    """The cut corpus still reaches every level (each releases n-grams, with spurious draws at k >= 2), gives
    rows_per_shard50 several shards, batch_rows 17 and 25 several batches and a shard several pieces."""
    assert all(len(want["dpne"].ngrams[k]) >= 10 for k in range(1, PARAMS.max_n + 1))
    assert all(level["expected_spurious_bound"] > 1 for level in want["dpne"].levels[1:])
    assert all(len(want["dpsu"].ngrams[k]) > 0 for k in (1, 2, 3))
    tokens = sum(len(t.split()) for _, t in records)
    assert tokens // 50 >= 10 and len(records) // 25 >= 4 and tokens // 3 > 10 * CHUNK_ROWS


@pytest.mark.parametrize("case", [*BATCHINGS, "arrow-and-elements"])
def test_seeded_columnar_equals_reference_for_any_batching_and_input_form(got, want, case):
    """One record per batch and one shard, several batches and shards, shards by rows, and Arrow batches mixed
    with elements: the same n-grams as the reference."""
    assert got[case]["ngrams"] == want["dpne"].lines()
    assert got[case]["levels"] == sorted(want["dpne"].levels, key=level_key)


def test_dpsu_runs_equal_reference_on_batches(got, want):
    assert got["dpsu-table"]["ngrams"] == want["dpsu"].lines()
    assert got["dpsu-table"]["levels"] == sorted(want["dpsu"].levels, key=level_key)


@pytest.mark.parametrize("weighting", WEIGHTINGS)
def test_allowlist_and_counts_equal_reference(got, want, weighting):
    ref, allow = want[f"allow-{weighting}"], set(want["allow"])
    lines = got[f"allow-{weighting}"]["counts"]
    assert lines == sorted(f"{k}\t{g}\t{c}" for k, cs in ref.counts.items() for g, c in cs.items())
    # every noise-released n-gram is allowlisted (spurious k-grams are uniform over V_k, as in the reference)
    assert len(lines) > 10 and all(line.split("\t")[1] in allow for line in lines if line.startswith("1\t"))


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
