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
#   .ci/engines.sh cluster up [pool|flink|spark]...   start the standalone clusters (default: all; what is
#                                   already running is kept), wait until whole; state in .engines-cluster/
#   .ci/engines.sh cluster down     stop every process `up` started (by pid)
#   .ci/engines.sh cluster status   the processes, their logs, the endpoints to submit to
#
# Why not the job-server jars: Maven Central as reachable here serves no
# org.apache.beam:beam-runners-{flink-1.19,spark-3}-job-server jar at any version (404), but it serves the
# runner modules those jars are shaded from, with all their dependencies, at Beam 2.62.0. Maven resolves
# them into a classpath and we start the same main classes the job-server jars start
# (FlinkJobServerDriver, SparkJobServerDriver). Beam 2.62.0 is the newest version whose runner modules
# resolve whole (2.70.0's beam-runners-java-job-service is not served); its Python SDK is on PyPI, so
# the engine tests run in .venv-engines with apache-beam==2.62.0 (the package supports >=2.51.0,
# constraints/minimum.txt).
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
  # -Xss16m: Flink's job invocation deserialises the compiled plan recursively; DPNE's at its default --max_n 9
  # overflows the default 1 MB thread stack (StackOverflowError; docs/engines.md, "Flink's plan optimizer")
  # shellcheck disable=SC2086  # ENGINES_JAVA_OPTS is a list of flags
  exec java ${ENGINES_JAVA_OPTS:--Xmx3g -Xss16m} "${JAVA_MODULE_OPTS[@]}" "${logging[@]}" -cp "$(cat "$cp")" "$main" "$@"
}

# --- standalone clusters (issue 29): .ci/engines.sh cluster up|down|status ------------------------------
# Every component is its own process, started here with `setsid` (its pid is its process group: stopping
# it stops its children too, a Spark worker's executors, the pool's SDK workers) and recorded in
# $CLUSTER/pids/NAME.pid; logs in $CLUSTER/logs/NAME.log; ports chosen once (free ports) in
# $CLUSTER/ports.env. `up` starts what is not running (so it also replaces a killed worker) and waits
# until the cluster is whole; if that fails it stops everything it started in this call. `down` stops
# every recorded pid (TERM to the group, KILL after 20 s). docs/engines.md has the table of processes.
CLUSTER=${DP_ENGINES_CLUSTER_DIR:-$PWD/.engines-cluster}
PARALLELISM=2
FLINK_TASKMANAGERS=2
SPARK_WORKERS=2

cluster_ports() {  # ports.env: free ports, chosen at the first `up` and kept (a restarted worker reuses them)
  mkdir -p "$CLUSTER/pids" "$CLUSTER/logs"
  # below the ephemeral range, so no socket the kernel numbers can take one first (tests/support/ports.py)
  [ -s "$CLUSTER/ports.env" ] || "$PY" -m tests.support.ports FLINK_RPC_PORT FLINK_REST_PORT FLINK_BLOB_PORT \
    FLINK_JOB_PORT SPARK_MASTER_PORT SPARK_MASTER_UI_PORT SPARK_WORKER_UI_PORT_1 SPARK_WORKER_UI_PORT_2 \
    SPARK_JOB_PORT SPARK_DRIVER_UI_PORT POOL_PORT > "$CLUSTER/ports.env"
  # shellcheck disable=SC1091
  . "$CLUSTER/ports.env"
}

pid_of() { cat "$CLUSTER/pids/$1.pid" 2>/dev/null || true; }
alive() { local pid; pid=$(pid_of "$1"); [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; }

STARTED=()  # components this `up` started: stopped again if it fails
start() {  # start NAME CMD...: CMD in its own session (pid = process group), log to logs/NAME.log
  local name=$1
  shift
  alive "$name" && return 0
  setsid "$@" > "$CLUSTER/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$CLUSTER/pids/$name.pid"
  STARTED+=("$name")
  echo "  started $name (pid $!, log $CLUSTER/logs/$name.log)"
}

stop() {  # stop NAME: TERM to its process group, KILL after 20 s
  local name=$1 pid i
  pid=$(pid_of "$name")
  [ -n "$pid" ] || return 0
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 40); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
  fi
  kill -KILL -- "-$pid" 2>/dev/null || true  # what is left of the group (executors, SDK workers)
  rm -f "$CLUSTER/pids/$name.pid"
  echo "  stopped $name (pid $pid)"
}

wait_for() {  # wait_for WHAT SECONDS NAME CHECK...: until CHECK succeeds; fails if NAME died or on timeout
  local what=$1 seconds=$2 name=$3 i
  shift 3
  for i in $(seq $((seconds * 2))); do
    if "$@" > /dev/null 2>&1; then return 0; fi
    if ! alive "$name"; then
      echo "engines.sh: $name exited before $what; last lines of its log:" >&2
      tail -40 "$CLUSTER/logs/$name.log" >&2
      return 1
    fi
    sleep 0.5
  done
  echo "engines.sh: no $what within ${seconds}s; last lines of $CLUSTER/logs/$name.log:" >&2
  tail -40 "$CLUSTER/logs/$name.log" >&2
  return 1
}

listening() { (exec 3<> "/dev/tcp/localhost/$1") 2> /dev/null; }
http_json() {  # http_json URL EXPR: EXPR (Python, over the JSON `j` that URL returns)
  "$PY" -c 'import json, sys, urllib.request; j = json.load(urllib.request.urlopen(sys.argv[1], timeout=5)); print(eval(sys.argv[2]))' "$1" "$2"
}
equals() {  # equals WANT CMD...: CMD prints WANT
  local want=$1
  shift
  [ "$("$@" 2> /dev/null)" = "$want" ]
}

classpath_jar() {  # classpath_jar ENGINE: a jar whose manifest Class-Path lists the engine's classpath
  # A job server submitting to a cluster stages its whole classpath with every job (Flink: ~150 jars,
  # 158 MB, uploaded to the blob server); started from this one jar it stages just this jar, and the
  # cluster's processes have the classes on their own classpath already.
  local engine=$1 jar="$DIR/$1-classpath.jar"
  if [ ! -s "$jar" ] || [ "$DIR/$engine.classpath" -nt "$jar" ]; then
    "$PY" - "$DIR/$engine.classpath" "$jar" <<'PYEOF'
import sys, zipfile
paths = open(sys.argv[1]).read().strip().split(":")
line = ("Class-Path: " + " ".join("file:" + p for p in paths)).encode()
lines = [line[:72]] + [b" " + line[i : i + 71] for i in range(72, len(line), 71)]  # 72-byte manifest lines
with zipfile.ZipFile(sys.argv[2] + ".tmp", "w") as z:
    z.writestr("META-INF/MANIFEST.MF", b"Manifest-Version: 1.0\r\n" + b"\r\n".join(lines) + b"\r\n\r\n")
PYEOF
    mv "$jar.tmp" "$jar"
  fi
  echo "$jar"
}

flink_cluster_config() {  # the standalone Flink cluster's config.yaml
  cat <<CONF
jobmanager.rpc.address: localhost
jobmanager.rpc.port: $FLINK_RPC_PORT
jobmanager.bind-host: localhost
rest.address: localhost
rest.bind-address: localhost
rest.port: $FLINK_REST_PORT
blob.server.port: $FLINK_BLOB_PORT
taskmanager.host: localhost
taskmanager.bind-host: localhost
jobmanager.memory.process.size: 768m
# A small TaskManager: JVM heap 1.1 GB (framework 128 MB + task 1 GB), managed memory 1 GB (off heap:
# batch sorts and joins, spilled to disk beyond it), network buffers 128 MB. The heap holds no data of
# ours but every running task's stage payload, each with a large part of the pipeline's protos: with a
# 384 MB heap (task 256 MB) the DPNE pipeline (hundreds of stages) spent its time in full GCs (600k
# RunnerApi.PCollection objects on the heap). A record must fit one sort buffer, a share of managed
# memory: 256 MB gave 3.2 MB, and Beam's batch GroupByKey on Flink concatenates a key's values into one
# record first (docs/engines.md).
taskmanager.numberOfTaskSlots: 2
taskmanager.memory.task.heap.size: ${FLINK_TASK_HEAP:-1024m}
taskmanager.memory.managed.size: 1024m
taskmanager.memory.network.min: 128m
taskmanager.memory.network.max: 128m
# Beam's data plane to the SDK workers (gRPC on Netty) takes its buffers from direct memory: Flink's
# default task off-heap of 0 fails a 4M-pair MAD-SIPS job with "OutOfMemoryError: Direct buffer memory".
taskmanager.memory.task.off-heap.size: 256m
# Blocking exchanges use sort-shuffle, 512 buffers each by default: more than 128 MB holds for a job's
# concurrent exchanges ("Insufficient number of network buffers").
taskmanager.network.sort-shuffle.min-buffers: 64
parallelism.default: $PARALLELISM
# Spread a job's tasks over both TaskManagers (the default fills one first): the shuffles cross processes.
cluster.evenly-spread-out-slots: true
# Beam's classes from the TaskManager's classpath: its SDK environments are then kept between the stages
# of a job (--environment_cache_millis) instead of one SDK worker process per stage.
classloader.resolve-order: parent-first
# Worker loss: a failed task, or a lost TaskManager (noticed within heartbeat.timeout, or at once by
# the tasks exchanging data with it), restarts the failed region (in a pipelined batch job usually the
# whole job) up to 100 times per job, 1 s apart (one loss: ~8 task failures); the job continues on the TaskManager that is left (2
# slots: enough for parallelism $PARALLELISM).
jobmanager.execution.failover-strategy: region
restart-strategy.type: fixed-delay
restart-strategy.fixed-delay.attempts: 100
restart-strategy.fixed-delay.delay: 1 s
heartbeat.interval: 2000
heartbeat.timeout: 10000
# Scratch (each TaskManager's tm_* directory holds every job's blobs, ~150 MB a job here; the shuffles'
# spill files) under the cluster's directory, removed by "cluster down": in the default /tmp a
# TaskManager that is killed (worker loss) or stopped leaves ~1 GB behind after a few jobs.
io.tmp.dirs: $CLUSTER/flink-tmp
web.tmpdir: $CLUSTER/flink-tmp
CONF
}

flink_resources() {  # flink_resources JM|TM: Flink's own computation of the JVM flags (line 1) and -D settings (2)
  java -cp "$(cat "$DIR/flink.classpath")" org.apache.flink.runtime.util.bash.BashJavaUtils \
    "GET_$1_RESOURCE_PARAMS" --configDir "$CLUSTER/flink-conf" 2> /dev/null | sed -n 's/^BASH_JAVA_UTILS_EXEC_RESULT://p'
}

flink_cluster_up() {
  local cp params i
  cp=$(cat "$DIR/flink.classpath")
  mkdir -p "$CLUSTER/flink-conf" "$CLUSTER/flink-tmp"
  flink_cluster_config > "$CLUSTER/flink-conf/config.yaml"
  local logging=(-Dorg.slf4j.simpleLogger.showDateTime=true -Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS)
  if ! alive flink-jobmanager; then
    params=$(flink_resources JM)
    # shellcheck disable=SC2046  # Flink's flag lists
    start flink-jobmanager java $(sed -n 1p <<< "$params") "${JAVA_MODULE_OPTS[@]}" "${logging[@]}" -cp "$cp" \
      org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint \
      --configDir "$CLUSTER/flink-conf" $(sed -n 2p <<< "$params")
  fi
  wait_for "the Flink REST API" 120 flink-jobmanager http_json "http://localhost:$FLINK_REST_PORT/overview" "j['taskmanagers']"
  params=$(flink_resources TM)
  for i in $(seq "$FLINK_TASKMANAGERS"); do
    # shellcheck disable=SC2046
    start "flink-taskmanager-$i" java $(sed -n 1p <<< "$params") "${JAVA_MODULE_OPTS[@]}" "${logging[@]}" -cp "$cp" \
      org.apache.flink.runtime.taskexecutor.TaskManagerRunner --configDir "$CLUSTER/flink-conf" $(sed -n 2p <<< "$params")
  done
  # Exactly FLINK_TASKMANAGERS registered: a killed TaskManager stays listed until its heartbeat times out.
  wait_for "$FLINK_TASKMANAGERS TaskManagers registered" 180 flink-jobmanager \
    equals "$FLINK_TASKMANAGERS" http_json "http://localhost:$FLINK_REST_PORT/overview" "j['taskmanagers']"
  start flink-job-server java -Xmx1g -Xss16m "${JAVA_MODULE_OPTS[@]}" "${logging[@]}" \
    -Dorg.slf4j.simpleLogger.log.org.apache.flink=warn -cp "$(classpath_jar flink)" \
    org.apache.beam.runners.flink.FlinkJobServerDriver --flink-master="localhost:$FLINK_REST_PORT" \
    --flink-conf-dir="$CLUSTER/flink-conf" --job-port "$FLINK_JOB_PORT" --artifact-port 0 --expansion-port 0
  wait_for "the Flink job server" 120 flink-job-server listening "$FLINK_JOB_PORT"
}

spark_home() {  # a SPARK_HOME for the standalone daemons: jars/ (links to the Maven-resolved classpath),
  # conf/log4j2.properties. A worker starts its executors with SPARK_HOME/jars/* as their classpath.
  local home="$CLUSTER/spark-home" jar
  mkdir -p "$home/jars" "$home/conf" "$home/work"
  tr ':' '\n' < "$DIR/spark.classpath" | while read -r jar || [ -n "$jar" ]; do  # no newline after the last
    [ -n "$jar" ] && ln -sf "$jar" "$home/jars/$(basename "$jar")"
  done
  echo "Spark $SPARK_VERSION (jars resolved by Maven: $DIR/spark.classpath)" > "$home/RELEASE"
  log4j2_config > "$home/conf/log4j2.properties"
  echo "$home"
}

# Spark: the master drops a worker after spark.worker.timeout seconds without a heartbeat, and a worker
# sends one every timeout/4 seconds of its own setting: both get the same value (a master-only setting
# had the workers dropped and re-registered over and over).
SPARK_WORKER_TIMEOUT=20
# Task attempts (a lost executor's tasks are not counted: Spark re-runs them and the stages whose shuffle
# output it held) and stage attempts (fetch failures after a loss).
SPARK_MAX_TASK_FAILURES=8

spark_cluster_up() {
  local home i
  home=$(spark_home)
  local env_=(env SPARK_HOME="$home" SPARK_SCALA_VERSION=2.12 SPARK_LOCAL_IP=127.0.0.1)
  local cp="$home/conf:$home/jars/*"
  start spark-master "${env_[@]}" java -Xmx384m "${JAVA_MODULE_OPTS[@]}" -cp "$cp" \
    -Dspark.worker.timeout="$SPARK_WORKER_TIMEOUT" org.apache.spark.deploy.master.Master \
    --host localhost --port "$SPARK_MASTER_PORT" --webui-port "$SPARK_MASTER_UI_PORT"
  wait_for "the Spark master" 120 spark-master http_json "http://localhost:$SPARK_MASTER_UI_PORT/json/" "j['status']"
  for i in $(seq "$SPARK_WORKERS"); do
    local ui="SPARK_WORKER_UI_PORT_$i"
    mkdir -p "$home/work/worker-$i"
    # 1 core and 1 GB for executors each; the worker's executor is its child (same process group)
    start "spark-worker-$i" "${env_[@]}" java -Xmx256m "${JAVA_MODULE_OPTS[@]}" -cp "$cp" \
      -Dspark.worker.timeout="$SPARK_WORKER_TIMEOUT" org.apache.spark.deploy.worker.Worker \
      --host localhost --port 0 --webui-port "${!ui}" --cores 1 --memory 1g \
      --work-dir "$home/work/worker-$i" "spark://localhost:$SPARK_MASTER_PORT"
  done
  # Exactly SPARK_WORKERS alive: a killed worker stays listed (DEAD) until spark.worker.timeout.
  wait_for "$SPARK_WORKERS Spark workers alive" 180 spark-master \
    equals "$SPARK_WORKERS" http_json "http://localhost:$SPARK_MASTER_UI_PORT/json/" "j['aliveworkers']"
  # The job server is the driver (client mode). --spark-master-url=local makes Beam skip staging its 232
  # classpath jars (it stages for a master that is not local), while the -Dspark.master system property
  # wins over it (Beam sets the master only when spark.master is unset): executors load everything from
  # SPARK_HOME/jars. Executors: 1 core, 768 MB each, at most 2 (one per worker).
  start spark-job-server "${env_[@]}" java -Xmx1536m "${JAVA_MODULE_OPTS[@]}" \
    -Dlog4j2.configurationFile="$home/conf/log4j2.properties" \
    -Dspark.master="spark://localhost:$SPARK_MASTER_PORT" -Dspark.ui.port="$SPARK_DRIVER_UI_PORT" \
    -Dspark.executor.memory=768m -Dspark.executor.cores=1 -Dspark.cores.max="$SPARK_WORKERS" \
    -Dspark.task.maxFailures="$SPARK_MAX_TASK_FAILURES" -Dspark.stage.maxConsecutiveAttempts=8 \
    -cp "$(cat "$DIR/spark.classpath")" org.apache.beam.runners.spark.SparkJobServerDriver \
    --spark-master-url=local --job-port "$SPARK_JOB_PORT" --artifact-port 0 --expansion-port 0
  wait_for "the Spark job server" 240 spark-job-server listening "$SPARK_JOB_PORT"
}

pool_up() {  # the SDK worker pool: its workers are `python -c ...` processes of .venv-engines in the repo
  PATH="$PWD/$VENV/bin:$PATH" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" \
    start sdk-worker-pool "$VENV/bin/python" -m tests.support.worker_pool --service_port="$POOL_PORT"
  wait_for "the SDK worker pool" 60 sdk-worker-pool listening "$POOL_PORT"
}

CLUSTER_COMPONENTS=(flink-job-server flink-taskmanager-1 flink-taskmanager-2 flink-jobmanager
  spark-job-server spark-worker-1 spark-worker-2 spark-master sdk-worker-pool)

cluster_down() {
  local name
  cluster_ports
  for name in "${CLUSTER_COMPONENTS[@]}"; do stop "$name"; done
  rm -rf "$CLUSTER/flink-tmp"  # the Flink processes' scratch (io.tmp.dirs), now that none is left
}

cluster_status() {  # one line per component; exit 1 unless all are running
  local name ok=0
  cluster_ports
  for name in "${CLUSTER_COMPONENTS[@]}"; do
    if alive "$name"; then
      printf '  %-20s running  pid %-8s %s\n' "$name" "$(pid_of "$name")" "$CLUSTER/logs/$name.log"
    else
      printf '  %-20s stopped\n' "$name"
      ok=1
    fi
  done
  echo "  Flink: web UI and REST http://localhost:$FLINK_REST_PORT, job endpoint localhost:$FLINK_JOB_PORT"
  echo "  Spark: master spark://localhost:$SPARK_MASTER_PORT (web UI http://localhost:$SPARK_MASTER_UI_PORT), job endpoint localhost:$SPARK_JOB_PORT"
  echo "  SDK worker pool: --environment_type EXTERNAL --environment_config localhost:$POOL_PORT"
  return $ok
}

cluster_up() {  # cluster_up [pool|flink|spark]... (default: all three)
  local parts=("$@") part
  [ ${#parts[@]} -gt 0 ] || parts=(pool flink spark)
  setup
  cluster_ports
  for part in "${parts[@]}"; do
    case "$part" in
      pool) pool_up || return 1 ;;
      flink) flink_cluster_up || return 1 ;;
      spark) spark_cluster_up || return 1 ;;
      *)
        echo "engines.sh: cluster up: unknown part $part (pool, flink, spark)" >&2
        return 2
        ;;
    esac
  done
  cluster_status > /dev/null || true
}

cluster_up_or_stop() {  # `cluster up`; on failure stop what this call started
  if ! cluster_up "$@"; then
    echo "engines.sh: cluster up failed; stopping what it started: ${STARTED[*]:-nothing}" >&2
    local name
    for name in "${STARTED[@]}"; do stop "$name"; done
    return 1
  fi
}

cmd=${1:-setup}
shift || true
case "$cmd" in
  setup) setup ;;
  test)
    setup
    export PYTHONWARNINGS="ignore::DeprecationWarning"
    # Every JVM of the test run (clusters, job servers, Spark's executors: JAVA_TOOL_OPTIONS reaches them
    # all) compiles with C1 only and collects with the serial collector: the test jobs are short and the
    # machine has 2 cores, where C2's compiler threads and G1's concurrent threads cost CPU the jobs need.
    # Measured (2-core machine): the two merged local-engine jobs took 284 CPU-s and 179 s with the JVM's
    # defaults, 187 CPU-s and 146 s with these. ENGINES_TEST_JVM_OPTS= (empty) keeps the defaults.
    export JAVA_TOOL_OPTIONS="${JAVA_TOOL_OPTIONS:+$JAVA_TOOL_OPTIONS }${ENGINES_TEST_JVM_OPTS--XX:TieredStopAtLevel=1 -XX:+UseSerialGC}"
    # The standalone clusters for the cluster cases, stopped again whatever the tests give (also on ^C).
    # Without Java the tests skip (engines.java_missing), so no cluster is started.
    if command -v java > /dev/null; then
      trap 'cluster_down' EXIT
      trap 'exit 130' INT TERM
      cluster_up_or_stop
      export DP_ENGINES_CLUSTER_DIR="$CLUSTER"
    fi
    status=0
    if [ $# -gt 0 ]; then
      # With pytest options (.ci/engines.sh test -k skew): one test process, as selected.
      "$VENV/bin/python" -m pytest tests/engines -q -m engines --durations=12 "$@" || status=$?
      exit $status
    fi
    # Three test processes side by side, one per deployment whose state its tests change: the Flink
    # cluster, the local Flink job server, Spark's cluster and local job server (tests/engines/conftest.py
    # marks them; one stream alone kept ~1.2 of the 2 cores busy). Each writes its log, printed when all
    # have ended; the 10 longest tests of each are in it.
    logs=$(mktemp -d)
    # Each case's DirectRunner output, which the Flink and the Spark streams both compare with, is computed by
    # one of them and read by the other (tests/support/shared_result.py): a directory of this run only.
    export DP_ENGINES_DIRECT_CACHE="$logs/direct"
    mkdir "$DP_ENGINES_DIRECT_CACHE"
    pids=()
    for stream in engines_flink_cluster engines_flink_local engines_spark; do
      "$VENV/bin/python" -m pytest tests/engines -q -m "engines and $stream" --durations=10 > "$logs/${#pids[@]}.log" 2>&1 &
      pids+=($!)
    done
    i=0
    for stream in engines_flink_cluster engines_flink_local engines_spark; do
      rc=0
      wait "${pids[$i]}" || rc=$?
      [ $rc -eq 0 ] || status=$rc
      echo "== engine tests -m \"engines and $stream\" (exit $rc) =="
      cat "$logs/$i.log"
      i=$((i + 1))
    done
    rm -rf "$logs"
    exit $status
    ;;
  flink|spark) job_server "$cmd" "$@" ;;
  python) exec "$VENV/bin/python" "$@" ;;
  cluster)
    sub=${1:-status}
    shift || true
    case "$sub" in
      up) cluster_up_or_stop "$@" ;;
      down) cluster_down ;;
      status) cluster_status ;;
      *)
        echo "usage: .ci/engines.sh cluster up [pool|flink|spark]... | down | status" >&2
        exit 2
        ;;
    esac
    ;;
  classpath) cat "$DIR/${1:?flink or spark}.classpath" ;;
  *) echo "usage: .ci/engines.sh setup | test [pytest args] | flink [flags] | spark [flags] | python ARGS | cluster up|down|status" >&2; exit 2 ;;
esac
