"""A cut of data/debian_words.tsv.gz made at test time: the first ``pairs_per_user`` pairs of every user.

With the default 12: 19,363 pairs, all 1,754 users (the full file's 200k pairs hold up to hundreds per user);
more than the 8 contributions the tests bound to, so the contribution bounding samples. Nothing of it is
written into the repository (tests write it under their tmp_path when a CLI needs a file).
"""

import functools
import gzip
import os
from collections import Counter

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
WORDS = os.path.join(REPO, "data", "debian_words.tsv.gz")
PAIRS_PER_USER = 12


@functools.lru_cache(maxsize=4)
def words_cut(pairs_per_user: int = PAIRS_PER_USER) -> tuple:
    """The first ``pairs_per_user`` (user, item) pairs of every user, in file order (a tuple: cached)."""
    held = Counter()
    out = []
    with gzip.open(WORDS, "rt", encoding="utf-8") as f:
        next(f)  # the header
        for line in f:
            user, item = line.rstrip("\n").split("\t")
            if held[user] < pairs_per_user:
                held[user] += 1
                out.append((user, item))
    return tuple(out)


def write_tsv(pairs, path) -> str:
    """``pairs`` as a tsv file with the bundled file's header; returns the path."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("user\titem\n")
        f.writelines(f"{u}\t{i}\n" for u, i in pairs)
    return str(path)
