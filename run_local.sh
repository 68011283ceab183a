#!/usr/bin/env bash
# ./run_local.sh        run the main job on the bundled sample with the DirectRunner
# ./run_local.sh test   run the full test suite: the main suite (pytest -n 2), then the engine tests on real
#                       Flink and Spark (.ci/engines.sh test); with arguments the main suite only (test
#                       tests/pipelines/test_cli_select.py[::name]: a file or folder; test -k mad -x: pytest options)
# ./run_local.sh test --quick   the quick tier (-m "not slow and not engines", a few minutes): between commits
# ./run_local.sh test --minimum the minimum-versions lane: .venv-min holds exactly the pins of
#                       constraints/minimum.txt (the oldest supported apache-beam, pyarrow, numpy, scipy =
#                       setup.py's lower bounds); runs the quick tier and every CLI on the bundled data there
# ./run_local.sh durations   re-measure the main suite's per-test seconds into tests/durations.json (what decides
#                       the tiers; with test files, only those are re-measured and replaced)
# PYTEST_WORKERS=N sets the number of test processes (default 3; 0: one process, no pytest-xdist).
# All but --minimum create .venv (if missing) and install the package with its test, gcp and bench extras
# (the newest versions).
set -euo pipefail
cd "$(dirname "$0")"

PY=${PYTHON:-python3}
if [ "${1:-} ${2:-}" != "test --minimum" ]; then
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
fi
export PYTHONWARNINGS="ignore::DeprecationWarning"

# run_clis BIN OUT: the three commands of `./run_local.sh` (the bundled samples, DirectRunner) with the
# console scripts of BIN (a venv's bin/), writing under OUT.
run_clis() {
  local bin=$1 out=$2
  mkdir -p "$out"
  # --overwrite: this demo replaces its own earlier outputs (release shards, report, charts); without
  # it a run refuses to start when they exist (docs/cli.md, "Outputs")
  echo "== select_partitions: MAD-SIPS (the default algorithm) on data/debian_words.tsv.gz (1,754 users), DirectRunner =="
  "$bin/dp-select-partitions" \
    --input data/debian_words.tsv.gz --input_format tsv \
    --output "$out/items" --report "$out/report.json" \
    --algorithm mad_sips --epsilon 1 --delta 1e-5 --max_contributions 100 \
    --plots "$out/plots" --overwrite \
    --runner DirectRunner --direct_running_mode in_memory
  echo "released items: $(cat "$out"/items-?????-of-????? | wc -l) in $out/items-?????-of-?????; report: $out/report.json; chart: $out/plots/released.png"
  if [ -f pipelines/extract_ngrams.py ] && [ -f data/debian_text.jsonl.gz ]; then
    echo "== extract_ngrams: DPNE on data/debian_text.jsonl.gz (1,000 users), DirectRunner =="
    "$bin/dp-extract-ngrams" \
      --input data/debian_text.jsonl.gz --input_format jsonl \
      --output "$out/ngrams" --report "$out/ngrams_report.json" \
      --max_n 6 --epsilon 4 --delta 1e-7 --max_contributions 100 --overwrite \
      --runner DirectRunner --direct_running_mode in_memory
    echo "released n-grams: $(cat "$out"/ngrams-?????-of-????? | wc -l) in $out/ngrams-?????-of-?????; report: $out/ngrams_report.json"
  fi
  if [ -f pipelines/bayesian_ngrams.py ] && [ -f data/bayesian_public_trigrams.tsv.gz ]; then
    echo "== bayesian_ngrams: trigram distribution with a public prior (noisy counts, then the posterior), DirectRunner =="
    "$bin/dp-bayesian-ngrams" \
      --private data/debian_text.jsonl.gz --input_format jsonl \
      --public data/bayesian_public_trigrams.tsv.gz \
      --output "$out/trigram_probs" --report "$out/bayesian_report.json" \
      --n 3 --epsilon 1 --delta 1e-5 --C 1 --W 100 --overwrite \
      --runner DirectRunner --direct_running_mode in_memory
  fi
}

# minimum_setup: .venv-min with the oldest supported versions (constraints/minimum.txt), idempotent (a stamp
# per setup.py and pins); fails when the installed versions are not exactly the pins. `./run_local.sh test`
# also runs it in the background during the main suite (a subshell, so `set -e` holds in it).
minimum_setup() {
  local venv=.venv-min pins=constraints/minimum.txt
  if [ ! -x "$venv/bin/python" ]; then
    echo "Creating $venv (the oldest supported versions, $pins) ..."
    "$PY" -m venv "$venv"
  fi
  local stamp="$venv/.installed-$(cat setup.py "$pins" | sha256sum | cut -c1-16)"
  if [ ! -f "$stamp" ]; then
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    # -c: the exact pins, for our dependencies and for everything they pull in that the file names
    "$venv/bin/python" -m pip install --quiet -c "$pins" -e '.[test]'
    touch "$stamp"
  fi
  # What is installed must be exactly the pins (a resolver that picked another version would test
  # something else).
  "$venv/bin/python" - "$pins" <<'PYEOF'
import sys
from importlib.metadata import PackageNotFoundError, version

pins, wrong = {}, []
for line in open(sys.argv[1], encoding="utf-8"):
    line = line.split("#", 1)[0].strip()
    if line:
        name, _, pin = line.partition("==")
        pins[name.strip()] = pin.strip()
for name, pin in pins.items():
    try:
        got = version(name)
    except PackageNotFoundError:
        got = "not installed"
    if got != pin:
        wrong.append(f"{name} {got} (pinned {pin})")
if wrong:
    sys.exit(f"minimum-versions lane: .venv-min does not hold the pins of {sys.argv[1]}: " + ", ".join(wrong))
print("minimum-versions lane: " + ", ".join(f"{n}=={p}" for n, p in pins.items()))
PYEOF
}

# minimum_lane: minimum_setup, then the quick tier and every CLI there; fails when a test or a CLI fails.
# Runs in its own process (./run_local.sh test --minimum), so `set -e` holds in it. The CLIs (one process
# at a time, mostly one core) run beside the quick tier's test processes, their log printed after it.
minimum_lane() {
  local venv=.venv-min
  minimum_setup
  lane_out=$(mktemp -d)  # global: the EXIT trap runs after this function has returned
  trap 'rm -rf "$lane_out"' EXIT
  local out=$lane_out/out
  (set -e; minimum_clis "$venv/bin" "$out") > "$lane_out/clis.log" 2>&1 &
  local clis_pid=$! tests_rc=0 clis_rc=0
  "$venv/bin/python" -m pytest -q "${workers[@]}" -m "not slow and not engines" -p no:cacheprovider || tests_rc=$?
  wait "$clis_pid" || clis_rc=$?
  echo "== the CLIs with the oldest supported versions (beside the tests; exit $clis_rc) =="
  cat "$lane_out/clis.log"
  [ $tests_rc -eq 0 ] || { echo "minimum-versions lane: the quick tier FAILED ($tests_rc)"; exit $tests_rc; }
  [ $clis_rc -eq 0 ] || { echo "minimum-versions lane: a CLI FAILED ($clis_rc)"; exit $clis_rc; }
  echo "minimum-versions lane: passed"
}

# minimum_clis BIN OUT: every CLI with BIN's console scripts (run_clis, then the verifier and the evaluator).
minimum_clis() {
  local bin=$1 out=$2
  run_clis "$bin" "$out"
  echo "== verify: the three releases are complete and unchanged (dp-verify-release) =="
  "$bin/dp-verify-release" "$out/report.json"
  "$bin/dp-verify-release" "$out/ngrams_report.json"
  "$bin/dp-verify-release" "$out/bayesian_report.json"
  echo "== bayesian_eval: KL vs epsilon on the bundled sample (one epsilon, one repeat) =="
  "$bin/dp-bayesian-eval" \
    --private data/debian_text.jsonl.gz --input_format jsonl \
    --public data/bayesian_public_trigrams.tsv.gz \
    --epsilons 1 --repeats 1 --n 3 --C 1 --W 100
  echo "CLIs with the oldest supported versions: passed"
}

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
    # --minimum: the minimum-versions lane alone (minimum_lane above).
    if [ "${1:-}" = "--minimum" ]; then
      shift
      [ $# -eq 0 ] || { echo "usage: ./run_local.sh test --minimum (takes no arguments)" >&2; exit 2; }
      minimum_lane
      exit 0
    fi
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
    # Without arguments (CI: .ci/run): three lanes, each whatever the others gave; any failing fails the
    # command. First the main suite (the newest versions, .venv; CPU-bound: its test processes keep both cores
    # busy) alone, while the other lanes' setups run in the background. Then the engine suite (real Flink and
    # Spark, .venv-engines; three test processes, one per stream of jobs, which mostly wait on submissions, JVM
    # start-ups and heartbeats) beside the minimum-versions lane (the oldest supported versions, .venv-min:
    # the quick tier in one test process with every CLI beside it). Measured on the 2-core machine (docs/
    # development.md): the engine jobs beside the CPU-bound main suite took twice their time alone and the
    # two together cost hundreds of CPU-s more than apart. Each lane's wall time is printed at the end (and
    # the setup's: .venv created or checked above).
    status=0 lanes=() t=$SECONDS
    lane() {  # lane NAME COMMAND...: runs it, records its status and wall time
      local name=$1 start=$SECONDS rc=0
      shift
      "$@" || rc=$?
      [ $rc -eq 0 ] || status=$rc
      lanes+=("$(printf '%-38s %5d s  %s' "$name" $((SECONDS - start)) "$([ $rc -eq 0 ] && echo passed || echo "FAILED ($rc)")")")
    }
    lanes+=("$(printf '%-38s %5d s' "setup (.venv)" "$t")")
    logs=$(mktemp -d)
    trap 'rm -rf "$logs"' EXIT
    # The other lanes' setups (.venv-engines and the job servers' jars from PyPI and Maven Central, then
    # .venv-min: mostly downloads, one after the other) in the background. Each lane runs its own setup again
    # when it starts: a no-op once that is done, and where the background one failed (a registry hiccup) it
    # tries again and fails visibly. Their log is printed after the main suite.
    (.ci/engines.sh setup; minimum_setup) > "$logs/setups" 2>&1 &
    prep_pid=$!
    lane "main suite (pytest -n ${PYTEST_WORKERS:-3})" .venv/bin/python -m pytest tests -q "${workers[@]}" -m "not engines"
    prep_start=$SECONDS
    prep_rc=0
    wait "$prep_pid" || prep_rc=$?
    echo "== setups of the other lanes (in the background during the main suite; exit $prep_rc) =="
    cat "$logs/setups"
    lanes+=("$(printf '%-38s %5d s' "  waited after it for their setups" $((SECONDS - prep_start)))")
    # The engine lane in the background, its output printed after the minimum-versions lane's.
    (lane "engine suite (Flink, Spark; beside)" .ci/engines.sh test > "$logs/engines" 2>&1
     printf '%s\n' "${lanes[-1]}" > "$logs/engines.lane"; exit $status) &
    engines_pid=$!
    lane "minimum-versions lane (-n 1, beside)" env PYTEST_WORKERS=1 ./run_local.sh test --minimum
    engines_start=$SECONDS
    engines_rc=0
    wait "$engines_pid" || engines_rc=$?
    [ $engines_rc -eq 0 ] || status=$engines_rc
    echo "== engine suite (three test processes, beside the minimum-versions lane) =="
    cat "$logs/engines"
    lanes+=("$(cat "$logs/engines.lane" 2>/dev/null || echo "engine suite: no status (exit $engines_rc)")")
    lanes+=("$(printf '%-38s %5d s' "  waited after the others for it" $((SECONDS - engines_start)))")
    echo "== lanes (wall time) =="
    printf '%s\n' "${lanes[@]}"
    printf '%-38s %5d s\n' "all" "$SECONDS"
    exit $status
    ;;
  durations)
    # Re-measure the main suite and rewrite tests/durations.json, which decides the tiers (tests/conftest.py).
    # With paths (./run_local.sh durations tests/x.py ...) only those files are re-measured and replaced.
    # Measured with an empty calibration cache (as CI and a fresh clone run): the test that builds a table
    # carries its cost, so a table's builder is not put in the quick tier for a cost it only had once cached.
    shift || true
    log=$(mktemp)
    cold=$(mktemp -d)
    DP_TEST_CALIBRATION_CACHE=${DP_TEST_CALIBRATION_CACHE:-$cold} .venv/bin/python -m pytest "${@:-tests}" -q -n "${PYTEST_WORKERS:-3}" --dist loadfile -m "not engines" \
      --durations=0 | tee "$log" || true
    .venv/bin/python -m tests.support.durations --update "$log"
    rm -rf "$log" "$cold"
    ;;
  run)
    run_clis .venv/bin out
    ;;
  *)
    echo "usage: ./run_local.sh [test [--quick | --minimum] [pytest args...] | durations [test files...]]" >&2
    exit 2
    ;;
esac
