#!/usr/bin/env bash
# Real Apache Flink and Apache Spark for the pipelines (issue 18): Beam's portable job servers and an
# SDK of the same Beam version.
#
#   .ci/engines.sh setup            fetch the job servers' jars from Maven Central into
#                                   ~/.cache/dp-partition-beam/ and create .venv-engines (idempotent)
#   .ci/engines.sh test [ARGS]      setup, then run tests/engines/test_engines.py (pytest -m engines) in .venv-engines
#   .ci/engines.sh flink [FLAGS]    run the Flink job server in the foreground (default flags:
#                                   --flink-master=[local] --job-port 8099, an embedded Flink cluster)
#   .ci/engines.sh spark [FLAGS]    run the Spark job server in the foreground (default flags:
#                                   --spark-master-url=local[2] --job-port 8099)
#   .ci/engines.sh python ARGS      run .venv-engines/bin/python ARGS (e.g. -m dp_partition_beam.pipelines.select_partitions ...)
#
# Why not the job-server jars: Maven Central as reachable here serves no
# org.apache.beam:beam-runners-{flink-1.19,spark-3}-job-server jar at any version (404), but it serves the
# runner modules those jars are shaded from, with all their dependencies, at Beam 2.62.0. Maven resolves
# them into a classpath and we start the same main classes the job-server jars start
# (FlinkJobServerDriver, SparkJobServerDriver). Beam 2.62.0 is the newest version whose runner modules
# resolve whole (2.70.0's beam-runners-java-job-service is not served); its Python SDK is on PyPI, so
# the engine tests run in .venv-engines with apache-beam==2.62.0 (the package supports >=2.50).
set -euo pipefail
cd "$(dirname "$0")/.."

BEAM_VERSION=2.62.0
FLINK_MINOR=1.19        # beam-runners-flink-1.19 (Flink 1.19.0, runs on Java 11 and 17)
SPARK_VERSION=3.5.1     # Spark 3.5 runs on Java 17 (with the --add-opens below); Beam's spark-3 runner
                        # leaves Spark "provided", so we pick it
SLF4J_VERSION=2.0.7     # Spark's log4j-slf4j2 binding needs the slf4j 2 API
CACHE=${DP_ENGINES_CACHE:-$HOME/.cache/dp-partition-beam}
DIR="$CACHE/beam-$BEAM_VERSION"
VENV=${DP_ENGINES_VENV:-.venv-engines}
PY=${PYTHON:-python3}

# The JVM options Spark and Flink set themselves for Java 17 (module access for serialization).
JAVA_MODULE_OPTS=(
  -XX:+IgnoreUnrecognizedVMOptions
  --add-opens=java.base/java.lang=ALL-UNNAMED
  --add-opens=java.base/java.lang.invoke=ALL-UNNAMED
  --add-opens=java.base/java.lang.reflect=ALL-UNNAMED
  --add-opens=java.base/java.io=ALL-UNNAMED
  --add-opens=java.base/java.net=ALL-UNNAMED
  --add-opens=java.base/java.nio=ALL-UNNAMED
  --add-opens=java.base/java.text=ALL-UNNAMED
  --add-opens=java.base/java.time=ALL-UNNAMED
  --add-opens=java.base/java.util=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED
  --add-opens=java.base/sun.nio.ch=ALL-UNNAMED
  --add-opens=java.base/sun.nio.cs=ALL-UNNAMED
  --add-opens=java.base/sun.security.action=ALL-UNNAMED
  --add-opens=java.base/sun.util.calendar=ALL-UNNAMED
)

pom() {  # pom ENGINE: a throwaway Maven project whose runtime classpath is that engine's job server
  local deps
  case "$1" in
    flink) deps="
    <dependency><groupId>org.apache.beam</groupId><artifactId>beam-runners-flink-$FLINK_MINOR</artifactId><version>$BEAM_VERSION</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>$SLF4J_VERSION</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-simple</artifactId><version>$SLF4J_VERSION</version></dependency>" ;;
    spark) deps="
    <dependency><groupId>org.apache.beam</groupId><artifactId>beam-runners-spark-3</artifactId><version>$BEAM_VERSION</version></dependency>
    <dependency><groupId>org.apache.spark</groupId><artifactId>spark-core_2.12</artifactId><version>$SPARK_VERSION</version></dependency>
    <dependency><groupId>org.apache.spark</groupId><artifactId>spark-streaming_2.12</artifactId><version>$SPARK_VERSION</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>$SLF4J_VERSION</version></dependency>" ;;
  esac
  cat <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dp-partition-beam.engines</groupId><artifactId>$1-job-server</artifactId><version>$BEAM_VERSION</version>
  <dependencies>$deps
  </dependencies>
</project>
EOF
}

fetch() {  # fetch ENGINE: resolve the job server's classpath (jars under $CACHE/m2) once
  local engine=$1 cp="$DIR/$1.classpath"
  [ -s "$cp" ] && return 0
  command -v mvn >/dev/null || { echo "engines.sh: Maven (mvn) is needed to fetch the $engine job server" >&2; return 1; }
  mkdir -p "$DIR"
  pom "$engine" > "$DIR/$engine-pom.xml"
  echo "Fetching the $engine job server (Beam $BEAM_VERSION) from Maven Central into $CACHE ..."
  local attempt
  for attempt in 1 2 3; do  # a registry hiccup should not fail CI
    if mvn -B -q -f "$DIR/$engine-pom.xml" -Dmaven.repo.local="$CACHE/m2" \
         dependency:build-classpath -Dmdep.includeScope=runtime -Dmdep.outputFile="$cp.tmp" >"$DIR/$engine-mvn.log" 2>&1; then
      mv "$cp.tmp" "$cp"
      return 0
    fi
    echo "mvn failed (attempt $attempt), see $DIR/$engine-mvn.log" >&2
    sleep 5
  done
  tail -20 "$DIR/$engine-mvn.log" >&2
  return 1
}

venv() {  # .venv-engines: apache-beam==$BEAM_VERSION and the package (editable) with its test extra
  if [ ! -x "$VENV/bin/python" ]; then
    echo "Creating $VENV (apache-beam==$BEAM_VERSION) ..."
    "$PY" -m venv "$VENV"
  fi
  local stamp="$VENV/.installed-$( (cat setup.py; echo "$BEAM_VERSION") | sha256sum | cut -c1-16)"
  if [ ! -f "$stamp" ]; then
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -e '.[test]' "apache-beam==$BEAM_VERSION"
    touch "$stamp"
  fi
}

setup() {
  venv
  if command -v java >/dev/null; then
    fetch flink
    fetch spark
  else
    echo "engines.sh: no java on PATH: the engine tests will be skipped" >&2
  fi
}

log4j2_config() {  # Spark's job server: Beam at INFO, Spark itself from WARN, all on stderr
  cat <<'EOF'
rootLogger.level = info
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n
logger.spark.name = org.apache.spark
logger.spark.level = warn
logger.sparkproject.name = org.sparkproject
logger.sparkproject.level = warn
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
EOF
}

job_server() {  # job_server ENGINE [FLAGS]: exec the job server (the tests start it this way too)
  local engine=$1 main defaults logging
  shift
  local cp="$DIR/$engine.classpath"
  [ -s "$cp" ] || { echo "engines.sh: no $engine job server yet: run .ci/engines.sh setup" >&2; exit 1; }
  case "$engine" in
    flink) main=org.apache.beam.runners.flink.FlinkJobServerDriver; defaults=(--flink-master='[local]')
           # slf4j-simple: Beam's job server at INFO, Flink's own chatter only from WARN
           logging=(-Dorg.slf4j.simpleLogger.log.org.apache.flink=warn -Dorg.slf4j.simpleLogger.showDateTime=true) ;;
    spark) main=org.apache.beam.runners.spark.SparkJobServerDriver; defaults=(--spark-master-url='local[2]')
           log4j2_config > "$DIR/log4j2.properties"
           logging=(-Dlog4j2.configurationFile="$DIR/log4j2.properties") ;;
  esac
  # Default: a local engine with 2 task slots / cores; artifact and expansion services on free ports so
  # that both job servers can run at once.
  [ $# -gt 0 ] || set -- "${defaults[@]}" --job-port 8099 --artifact-port 0 --expansion-port 0
  # shellcheck disable=SC2086  # ENGINES_JAVA_OPTS is a list of flags
  exec java ${ENGINES_JAVA_OPTS:--Xmx3g} "${JAVA_MODULE_OPTS[@]}" "${logging[@]}" -cp "$(cat "$cp")" "$main" "$@"
}

cmd=${1:-setup}
shift || true
case "$cmd" in
  setup) setup ;;
  test)
    setup
    export PYTHONWARNINGS="ignore::DeprecationWarning"
    exec "$VENV/bin/python" -m pytest tests/engines/test_engines.py -q -m engines "$@"
    ;;
  flink|spark) job_server "$cmd" "$@" ;;
  python) exec "$VENV/bin/python" "$@" ;;
  classpath) cat "$DIR/${1:?flink or spark}.classpath" ;;
  *) echo "usage: .ci/engines.sh setup | test [pytest args] | flink [flags] | spark [flags] | python ARGS" >&2; exit 2 ;;
esac
