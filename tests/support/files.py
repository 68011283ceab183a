"""File-tree helpers shared by the output tests."""

import hashlib
import os


def snapshot(root):
    """path -> 'dir' or the sha256 of the file, for everything under ``root``."""
    out = {}
    for base, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(base, d), root)] = "dir"
        for f in files:
            path = os.path.join(base, f)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out
