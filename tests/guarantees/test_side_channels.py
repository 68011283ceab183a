"""No side channels (issue 9, point 4): a canary item held by one user, and the exact data-dependent
counts, appear in no output of a default run: stdout/stderr, log records at DEBUG (ours and Beam's),
Beam metrics (user counters/distributions/gauges of the PipelineResult), the JSON report, and the
released items (the canary is held by one user; at delta = 1e-10 it is released with probability
<= 1e-10 per run).

Exact counts checked: users, records, distinct pairs, pairs after bounding, tokens (all >= 1000 and
chosen so that no DP output or parameter of these runs can equal them by coincidence; smaller
counts such as the number of distinct items could collide with released counts and are not grepped).
"""

import json
import logging
import random
import re

import pytest

from dp_partition_beam.pipelines import cli, extract_ngrams, select_partitions

CANARY = "canaryqz7x"
N_USERS = 1373
MAX_CONTRIBUTIONS = 2


def _data():
    rnd = random.Random(17)
    vocab = [f"w{j}" for j in range(40)]
    records = []
    for u in range(N_USERS):
        items = rnd.sample(vocab, rnd.randint(3, 4))
        records += [(f"user{u}", i) for i in items]
        records.append((f"user{u}", items[0]))  # a duplicated line
    records += [("canaryuser", CANARY), ("canaryuser", "w1"), ("canaryuser", "w2")]
    users = {u for u, _ in records}
    pairs = set(records)
    counts = {
        "users": len(users),
        "records": len(records),
        "distinct_pairs": len(pairs),
        "pairs_after_bounding": sum(min(MAX_CONTRIBUTIONS, len({i for v, i in pairs if v == u})) for u in users),
    }
    return records, counts


RECORDS, COUNTS = _data()


def _texts():
    by_user = {}
    for u, i in RECORDS:
        by_user.setdefault(u, []).append(i)
    return [(u, " ".join(items)) for u, items in by_user.items()]


def _metrics_text(result):
    if result is None:
        return ""
    parts = []
    query = result.metrics().query()
    for kind in ("counters", "distributions", "gauges"):
        for m in query.get(kind, []):
            parts.append(f"{m.key.metric.namespace} {m.key.metric.name} {m.key.step} {m.committed} {m.attempted}")
    return "\n".join(parts)


def _assert_clean(texts, counts):
    blob = "\n".join(texts)
    assert CANARY not in blob
    for name, n in counts.items():
        assert n >= 1000, name
        assert not re.search(rf"(?<![\d.]){n}(?![\d])", blob), f"exact count {name}={n} leaked"


def _run(tmp_path, caplog, capsys, run, argv):
    with caplog.at_level(logging.DEBUG):
        code = run(argv)
    captured = capsys.readouterr()
    logs = [r.getMessage() for r in caplog.records] + [
        logging.Formatter().formatException(r.exc_info) for r in caplog.records if r.exc_info
    ]
    return code, captured, logs, _metrics_text(cli.last_result)


@pytest.mark.parametrize("algorithm", ["mad2r", "dp_sips", "count_laplace"])
def test_select_partitions_leaks_neither_canary_nor_counts(tmp_path, caplog, capsys, algorithm):
    src = tmp_path / "in.tsv"
    src.write_text("user\titem\n" + "".join(f"{u}\t{i}\n" for u, i in RECORDS), encoding="utf-8")
    out, rep = tmp_path / "out" / "items", tmp_path / "out" / "report.json"
    code, captured, logs, metrics = _run(
        tmp_path,
        caplog,
        capsys,
        select_partitions.run,
        [
            "--input",
            str(src),
            "--input_format",
            "tsv",
            "--output",
            str(out),
            "--report",
            str(rep),
            "--algorithm",
            algorithm,
            "--epsilon",
            "4",
            "--delta",
            "1e-10",
            "--max_contributions",
            str(MAX_CONTRIBUTIONS),
            "--direct_running_mode",
            "in_memory",
            "--log_level",
            "DEBUG",  # the most the CLI ever logs: ours at DEBUG, Beam's at INFO
        ],
    )
    assert code == 0
    released = "".join(p.read_text(encoding="utf-8") for p in (tmp_path / "out").glob("items*"))
    report = rep.read_text(encoding="utf-8")
    assert json.loads(report)["released"] == len(released.splitlines()) > 0  # the run did release items
    assert logs  # DEBUG logging was captured (Beam logs at DEBUG/INFO during a run)
    _assert_clean([captured.out, captured.err, *logs, metrics, report, released], COUNTS)


def test_extract_ngrams_leaks_neither_canary_nor_counts(tmp_path, caplog, capsys):
    src = tmp_path / "in.jsonl"
    texts = _texts()
    src.write_text("".join(json.dumps({"user": u, "text": t}) + "\n" for u, t in texts), encoding="utf-8")
    counts = {"users": len(texts), "records": len(texts), "tokens": sum(len(t.split()) for _, t in texts)}
    out, rep = tmp_path / "out" / "ngrams", tmp_path / "out" / "report.json"
    code, captured, logs, metrics = _run(
        tmp_path,
        caplog,
        capsys,
        extract_ngrams.run,
        [
            "--input",
            str(src),
            "--input_format",
            "jsonl",
            "--output",
            str(out),
            "--report",
            str(rep),
            "--max_n",
            "3",
            "--epsilon",
            "4",
            "--delta",
            "1e-10",
            "--max_contributions",
            "4",
            "--direct_running_mode",
            "in_memory",
            "--log_level",
            "DEBUG",  # the most the CLI ever logs: ours at DEBUG, Beam's at INFO
        ],
    )
    assert code == 0
    released = "".join(p.read_text(encoding="utf-8") for p in (tmp_path / "out").glob("ngrams*"))
    report = rep.read_text(encoding="utf-8")
    assert released  # the run released n-grams
    _assert_clean([captured.out, captured.err, *logs, metrics, report, released], counts)


def test_the_canary_check_can_fail(tmp_path):
    # Sanity: the grep finds the canary and the counts when they are there.
    with pytest.raises(AssertionError):
        _assert_clean([f"x {CANARY} y"], COUNTS)
    with pytest.raises(AssertionError):
        _assert_clean([f"processed {COUNTS['users']} users"], COUNTS)
    _assert_clean([f"sigma {COUNTS['users']}1.5 0.{COUNTS['users']}"], COUNTS)  # digits inside numbers are not counts


def test_diagnostics_is_the_only_place_with_exact_counts(tmp_path, caplog, capsys):
    # With --diagnostics PATH the exact counts go to that clearly labelled NON-PRIVATE file (and to
    # Beam counters in namespace diagnostics_non_private); the report, outputs and logs stay clean.
    src = tmp_path / "in.tsv"
    src.write_text("user\titem\n" + "".join(f"{u}\t{i}\n" for u, i in RECORDS), encoding="utf-8")
    out, rep, diag = tmp_path / "out" / "items", tmp_path / "out" / "report.json", tmp_path / "diag.json"
    code, captured, logs, metrics = _run(
        tmp_path,
        caplog,
        capsys,
        select_partitions.run,
        [
            "--input",
            str(src),
            "--input_format",
            "tsv",
            "--output",
            str(out),
            "--report",
            str(rep),
            "--algorithm",
            "mad2r",
            "--epsilon",
            "4",
            "--delta",
            "1e-10",
            "--diagnostics",
            str(diag),
            "--max_contributions",
            str(MAX_CONTRIBUTIONS),
            "--direct_running_mode",
            "in_memory",
            "--log_level",
            "DEBUG",  # the most the CLI ever logs: ours at DEBUG, Beam's at INFO
        ],
    )
    assert code == 0
    diagnostics = json.loads(diag.read_text(encoding="utf-8"))
    assert diagnostics["NON_PRIVATE_DIAGNOSTICS"] is True
    text = json.dumps(diagnostics)
    for name in ("users", "records", "pairs_after_bounding"):
        assert re.search(rf"(?<![\d.]){COUNTS[name]}(?![\d])", text), name  # the opt-in does carry them
    assert CANARY not in text  # counts only, never items
    released = "".join(p.read_text(encoding="utf-8") for p in (tmp_path / "out").glob("items*"))
    report = rep.read_text(encoding="utf-8")
    _assert_clean([report, released, *logs], COUNTS)
