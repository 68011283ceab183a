"""Writes tests/durations.json, the measured seconds per test that decide the tiers (tests/conftest.py).

    python -m tests.support.durations [--update] LOG [LOG ...]

LOG is the output of ``pytest --durations=0`` over the main suite (``./run_local.sh durations`` runs it
with -n 3 on the machine, as CI does, and calls this). Each line ``12.34s call     tests/x.py::test_y[a]``
adds to that test's total (setup, call and teardown summed: a module fixture's cost falls on the test that
set it up, where the quick tier pays it too). Tests the logs do not name keep no entry
(quick until measured). With ``--update`` the file's entries are kept except those of the test files the
logs measured, which the logs replace (a refresh of a few files). The file is sorted by node id, seconds
rounded to 0.01, so a refresh diffs line by line.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys

LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s+(setup|call|teardown)\s+(tests/\S.*?)\s*$")
OUT = pathlib.Path(__file__).resolve().parents[1] / "durations.json"


def parse(lines) -> dict:
    """{node id: seconds} summed over the phases of each ``--durations`` line."""
    out = {}
    for line in lines:
        m = LINE.match(line)
        if m:
            out[m.group(3)] = out.get(m.group(3), 0.0) + float(m.group(1))
    return out


def write(durations: dict, path=OUT) -> None:
    text = json.dumps({k: round(v, 2) for k, v in sorted(durations.items())}, indent=0, ensure_ascii=False)
    pathlib.Path(path).write_text(text + "\n", encoding="utf-8")


def merge(old: dict, new: dict) -> dict:
    """``old`` without the entries of the files ``new`` measured, then ``new``."""
    files = {k.split("::", 1)[0] for k in new}
    out = {k: v for k, v in old.items() if k.split("::", 1)[0] not in files}
    out.update(new)
    return out


def main(argv) -> int:
    update = bool(argv) and argv[0] == "--update"
    argv = argv[1:] if update else argv
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    durations = {}
    for log in argv:
        with open(log, encoding="utf-8", errors="replace") as f:
            for k, v in parse(f).items():
                durations[k] = durations.get(k, 0.0) + v
    if not durations:
        print(f"no --durations lines in {', '.join(argv)}: was pytest run with --durations=0?", file=sys.stderr)
        return 1
    if update and OUT.exists():
        durations = merge(json.loads(OUT.read_text(encoding="utf-8")), durations)
    write(durations)
    print(f"{OUT}: {len(durations)} tests, {sum(durations.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
