"""Where the large real corpora live (read at test or benchmark time, never copied into the repository).

The corpora of the project's shared data folder (``commits``, ``msnbc``, ``imdb``, ``higgs``,
``retail``, ``debian_b``) come with their own READMEs there. Only files built from ``debian_b`` are
bundled (``data/``, rebuilt by ``data/build_samples.py``); everything else is read from the folder
this module resolves, in this order:

1. the environment variable ``DP_SHARED_DATA`` (if set, it must be the folder);
2. ``<repository root>/../shared/data``;
3. ``/work/shared/data``.

A file missing there raises :class:`SharedDataMissing` (a ``FileNotFoundError``) that names the
file, the folders tried and the variable; tests fail with it rather than skip.

    from benchmarks.shared_data import shared_data_path
    path = shared_data_path("msnbc.jsonl.gz")
"""

from __future__ import annotations

import gzip
import os

ENV_VAR = "DP_SHARED_DATA"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CANDIDATES = (os.path.normpath(os.path.join(REPO, os.pardir, "shared", "data")), "/work/shared/data")


class SharedDataMissing(FileNotFoundError):
    """A file of the shared data folder is not there (the message says where it was looked for)."""


def shared_data_path(name: str) -> str:
    """Path of ``name`` (e.g. ``commits.user_words.tsv.gz``) in the shared data folder; raises
    :class:`SharedDataMissing` naming the file, the folders tried and ``DP_SHARED_DATA`` if absent."""
    env = os.environ.get(ENV_VAR)
    tried = [env] if env else list(CANDIDATES)
    for folder in tried:
        path = os.path.join(folder, name)
        if os.path.exists(path):
            return path
    where = f"{ENV_VAR}={env!r}" if env else f"{ENV_VAR} is not set; looked in " + " and ".join(tried)
    raise SharedDataMissing(
        f"shared data file {name!r} not found ({where}). Set {ENV_VAR} to the folder that holds the "
        f"project's shared corpora (commits, msnbc, imdb, higgs, retail, debian_b) to run this."
    )


def read_user_sets(path: str) -> dict:
    """dict user -> [distinct item] of a ``user<TAB>item`` .tsv.gz with a header line (the shared
    corpora's ``*.user_words.tsv.gz``). Lines are split at ``\n`` only: some IMDb items hold C1 control
    characters that universal newlines or ``str.splitlines`` would break (README.mad_datasets.md)."""
    from dp_partition_beam.transforms.selection.reference import user_sets_from_pairs

    with gzip.open(path, "rt", encoding="utf-8", newline="\n") as f:
        next(f)  # header user<TAB>item
        return user_sets_from_pairs(tuple(line.rstrip("\n").split("\t", 1)) for line in f)
