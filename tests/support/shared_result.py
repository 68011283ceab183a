"""A value computed once by whichever of several test processes asks first, read from disk by the others.

The engine suite runs three pytest processes side by side (.ci/engines.sh test), and the tests of two of them
compare their engines' output with the same cases' DirectRunner runs: each process would run those again.
:func:`shared_json` runs ``build`` once per key and directory: the first caller takes the key's file lock
(``fcntl.flock``), builds and writes the JSON by rename (a reader never sees half a file); a caller that waited
on the lock, or comes later, reads it. Without a directory (a single process) it just builds.

The directory must belong to one run of one checkout (``.ci/engines.sh test`` makes a fresh one and removes
it), and the key must name everything the value depends on there (the caller hashes its inputs into it): what
is read back is what the build computed in another process of the same run, from the same code.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pathlib
import tempfile
from typing import Callable, Optional


def shared_json(directory: Optional[str], key: str, build: Callable[[], dict]) -> dict:
    """``build()`` (a JSON-able dict), computed once per ``key`` in ``directory`` across processes."""
    if not directory:
        return build()
    root = pathlib.Path(directory)
    name = hashlib.sha256(key.encode()).hexdigest()
    path = root / f"{name}.json"
    with open(root / f"{name}.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait, then read its file
        try:
            if path.exists():
                with open(path, encoding="utf-8") as f:
                    stored = json.load(f)
                if stored["key"] != key:  # a sha256 collision, or a foreign file: never read a wrong value
                    raise RuntimeError(f"{path} holds the value of another key")
                return stored["value"]
            value = build()  # an error is raised as the unshared build raises it (nothing is written)
            fd, tmp = tempfile.mkstemp(dir=root, suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"key": key, "value": value}, f)
            os.replace(tmp, path)
            return value
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
