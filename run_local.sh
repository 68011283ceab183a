#!/usr/bin/env bash
# ./run_local.sh        run the main job on the bundled sample with the DirectRunner
# ./run_local.sh test   run the full test suite: the main suite (pytest -n 2), then the engine tests on real
#                       Flink and Spark (.ci/engines.sh test); with arguments the main suite only (test
#                       tests/pipelines/test_cli_select.py[::name]: a file or folder; test -k mad -x: pytest options)
# ./run_local.sh test --quick   the quick tier (-m "not slow and not engines", a few minutes): between commits
# PYTEST_WORKERS=N sets the number of test processes (default 2; 0: one process, no pytest-xdist).
# Both create .venv (if missing) and install the package with its test, gcp and bench extras.
set -euo pipefail
cd "$(dirname "$0")"

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "Creating .venv and installing the package (first run takes about a minute)..."
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(cat setup.py | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  # gcp: the Dataflow dry-run and staging tests; test includes matplotlib for the plot tests;
  # bench: PipelineDP for benchmarks.run_all and its smoke test.
  .venv/bin/python -m pip install --quiet -e '.[test,gcp,bench]'
  touch "$stamp"
fi
export PYTHONWARNINGS="ignore::DeprecationWarning"

cmd=${1:-run}
case "$cmd" in
  test)
    shift || true
    # pytest exits 5 when it collects nothing; that must fail loudly, so no special-casing here.
    # The tests are in folders mirroring the package (tests/privacy, tests/transforms/..., tests/pipelines,
    # tests/guarantees, tests/architecture, tests/engines, ...; docs/development.md). Markers (pyproject.toml):
    # `slow` (minutes-long: audit, multi_processing, CLIs in subprocesses, golden outputs, ...; the list is
    # in tests/conftest.py) and `engines` (real Flink and Spark). The engine tests run in .venv-engines,
    # whose apache-beam is the job servers' version: .ci/engines.sh fetches what they need (the job
    # servers from Maven Central, apache-beam from PyPI) and runs them; with pytest options:
    # .ci/engines.sh test -k ...
    # Test processes (pytest-xdist): whole files per process (--dist loadfile), so a file's module
    # fixtures run once. Three processes on the 2-core machine: many tests wait on a CLI subprocess or
    # a runner's threads, so a third process fills the gaps (docs/development.md has the timings).
    workers=(-n "${PYTEST_WORKERS:-3}" --dist loadfile)
    # --quick: the quick tier, what to run between commits: everything but `slow` and `engines`.
    if [ "${1:-}" = "--quick" ]; then
      shift
      exec .venv/bin/python -m pytest -q "${workers[@]}" -m "not slow and not engines" "$@"
    fi
    # A path first (./run_local.sh test tests/pipelines/test_cli_select.py[::name]) runs just that (in one
    # process); other arguments go to pytest over the whole main suite.
    if [ $# -gt 0 ] && [ -e "${1%%::*}" ]; then
      exec .venv/bin/python -m pytest -q -m "not engines" "$@"
    fi
    if [ $# -gt 0 ]; then
      exec .venv/bin/python -m pytest tests -q "${workers[@]}" -m "not engines" "$@"
    fi
    # Without arguments (CI: .ci/run): both suites, the engine tests whatever the main suite gave;
    # either failing fails the command.
    status=0
    .venv/bin/python -m pytest tests -q "${workers[@]}" -m "not engines" || status=$?
    .ci/engines.sh test || status=$?
    exit $status
    ;;
  run)
    out=out
    mkdir -p "$out"
    # --overwrite: this demo replaces its own earlier outputs (release shards, report, charts); without
    # it a run refuses to start when they exist (docs/cli.md, "Outputs")
    echo "== select_partitions: MAD-SIPS (the default algorithm) on data/debian_words.tsv.gz (1,754 users), DirectRunner =="
    .venv/bin/dp-select-partitions \
      --input data/debian_words.tsv.gz --input_format tsv \
      --output "$out/items" --report "$out/report.json" \
      --algorithm mad_sips --epsilon 1 --delta 1e-5 --max_contributions 100 \
      --plots "$out/plots" --overwrite \
      --runner DirectRunner --direct_running_mode in_memory
    echo "released items: $(cat "$out"/items-?????-of-????? | wc -l) in $out/items-?????-of-?????; report: $out/report.json; chart: $out/plots/released.png"
    if [ -f pipelines/extract_ngrams.py ] && [ -f data/debian_text.jsonl.gz ]; then
      echo "== extract_ngrams: DPNE on data/debian_text.jsonl.gz (1,000 users), DirectRunner =="
      .venv/bin/dp-extract-ngrams \
        --input data/debian_text.jsonl.gz --input_format jsonl \
        --output "$out/ngrams" --report "$out/ngrams_report.json" \
        --max_n 6 --epsilon 4 --delta 1e-7 --max_contributions 100 --overwrite \
        --runner DirectRunner --direct_running_mode in_memory
      echo "released n-grams: $(cat "$out"/ngrams-?????-of-????? | wc -l) in $out/ngrams-?????-of-?????; report: $out/ngrams_report.json"
    fi
    if [ -f pipelines/bayesian_ngrams.py ] && [ -f data/bayesian_public_trigrams.tsv.gz ]; then
      echo "== bayesian_ngrams: trigram distribution with a public prior (Algorithm 2), DirectRunner =="
      .venv/bin/dp-bayesian-ngrams \
        --private data/debian_text.jsonl.gz --input_format jsonl \
        --public data/bayesian_public_trigrams.tsv.gz \
        --output "$out/trigram_probs" --report "$out/bayesian_report.json" \
        --n 3 --epsilon 1 --delta 1e-5 --C 1 --W 100 \
        --tune --S_grid 0.001,0.01 --rho_grid 0.05,0.1,0.3 --overwrite \
        --runner DirectRunner --direct_running_mode in_memory
    fi
    ;;
  *)
    echo "usage: ./run_local.sh [test [--quick] [pytest args...]]" >&2
    exit 2
    ;;
esac
