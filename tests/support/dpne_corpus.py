"""The Markov corpus the DPNE reference tests share (tests/transforms/dpne/test_dpne_reference.py and
test_dpne_mad_sips.py), built once per test process: its records, every user's k-grams up to length 5 and
each k-gram's user count."""

import functools

from dp_partition_beam.transforms.dpne.reference import ngram_user_counts, user_kgrams
from dp_partition_beam.transforms.testing.synthetic import markov_corpus

#: 1,500 users (was 3,000): every level up to 5 still releases hundreds of n-grams (about 100 words, 200-370 at
#: k = 2..5), with about 10 spurious k-grams a run at eta=0.1, at about half the reference's time a run
USERS = 1500


@functools.lru_cache(maxsize=None)
def corpus(users=USERS, vocab=120, seed=4, max_n=5):
    """``(records, user k-grams, user counts)``; shared: callers copy before they change any of it."""
    recs = markov_corpus(users, vocab=vocab, branching=3, seed=seed)
    ug = user_kgrams(recs, max_n)
    return recs, ug, ngram_user_counts(ug)
