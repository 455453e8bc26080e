#!/usr/bin/env bash
# A Ray cluster on this one machine, for trying `flexbatch submit` and multi-node runs locally:
# a head node without CPUs for engines (like infra/cluster.yaml's head) plus N worker nodes, all on
# 127.0.0.1, each a separate raylet with its own --temp-dir. Token authentication is on.
#
#   scripts/local_cluster.sh up [N]   # head + N workers (default 2), 1 CPU each: FLEXBATCH_WORKER_CPUS
#   scripts/local_cluster.sh status   # `ray status` of this cluster
#   scripts/local_cluster.sh down     # stops this cluster's processes, and only those
#
# Settings (environment): FLEXBATCH_CLUSTER_DIR (/tmp/flexbatch-cluster: temp dirs, logs, state),
# FLEXBATCH_RAY_PORT (6379), FLEXBATCH_DASHBOARD_PORT (8265), FLEXBATCH_AGENT_PORT (52365: node i uses
# this + i), FLEXBATCH_HEAD_CPUS (0), FLEXBATCH_WORKER_CPUS (1), FLEXBATCH_OBJECT_STORE_MB (256).
#
# Facts about Ray 2.60 that shape this script:
# - `ray start --head` turns token auth OFF when no token exists yet, and RAY_AUTH_MODE=token without a
#   token makes the GCS hang at start. So: make the token first (`ray get-auth-token --generate` writes
#   ~/.ray/auth_token if missing), then start every node with RAY_AUTH_MODE=token exported.
# - Several raylets on one machine work (measured: tasks and actors run on every node), but each needs its
#   own dashboard agent port: with the default 52365 for all, the second node's dashboard agent fails to
#   bind ("address already in use" in its dashboard_agent.log).
# - Ray replaces 127.0.0.1 by the machine's address for the node IP, and the GCS listens on all interfaces:
#   token auth is what keeps others out. The dashboard (job server) listens on 127.0.0.1 only.
# - `ray stop` stops every Ray process of the machine, other people's too. `down` instead stops the process
#   sessions that `up` started (each node is started under setsid and its session id recorded).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -x "$ROOT/.venv/bin/ray" ]]; then
  export PATH="$ROOT/.venv/bin:$PATH"   # jobs' `python -m jobs.run` must find this Python too
fi
RAY="$(command -v ray || true)"
PY="$(dirname "${RAY:-/x}")/python"; [[ -x "$PY" ]] || PY=python3   # the Python that has ray
DIR="${FLEXBATCH_CLUSTER_DIR:-/tmp/flexbatch-cluster}"
RAY_PORT="${FLEXBATCH_RAY_PORT:-6379}"
DASHBOARD_PORT="${FLEXBATCH_DASHBOARD_PORT:-8265}"
AGENT_PORT="${FLEXBATCH_AGENT_PORT:-52365}"
HEAD_CPUS="${FLEXBATCH_HEAD_CPUS:-0}"
WORKER_CPUS="${FLEXBATCH_WORKER_CPUS:-1}"
OBJECT_STORE_BYTES=$(( ${FLEXBATCH_OBJECT_STORE_MB:-256} * 1024 * 1024 ))
SESSIONS="$DIR/sessions"   # one line per node: "<name> <session id>"
export RAY_AUTH_MODE=token RAY_USAGE_STATS_ENABLED=0

die() { echo "local_cluster: $*" >&2; exit 1; }

# Start one node (`ray start ARGS`) in a new process session, and record that session.
start_node() {
  local name="$1"; shift
  mkdir -p "$DIR/$name"
  setsid "$RAY" start --temp-dir="$DIR/$name" --object-store-memory="$OBJECT_STORE_BYTES" \
    --disable-usage-stats "$@" >"$DIR/$name.start.log" 2>&1 &
  local pid=$!
  wait "$pid" || { cat "$DIR/$name.start.log" >&2; echo "$name $pid" >>"$SESSIONS"; down; die "$name failed to start"; }
  echo "$name $pid" >>"$SESSIONS"   # setsid without a fork: the session id is this pid
}

# The live processes of session $1 (zombies excluded: they are gone, only not yet reaped).
session_pids() { ps -eo pid=,sid=,stat= | awk -v s="$1" '$2 == s && $3 !~ /^Z/ { print $1 }'; }

live_pids() {
  [[ -f "$SESSIONS" ]] || return 0
  local name sid
  while read -r name sid; do session_pids "$sid"; done <"$SESSIONS"
}

# The job server is ready when `ray job list` (which sends the token) answers.
wait_for_job_server() {
  for _ in $(seq 60); do
    "$RAY" job list --address "http://127.0.0.1:$DASHBOARD_PORT" >/dev/null 2>&1 && return 0
    sleep 1
  done
  die "the job server at http://127.0.0.1:$DASHBOARD_PORT did not answer within 60 s; see" \
    "$DIR/head/session_latest/logs/dashboard.log, then: $0 down"
}

up() {
  local workers="${1:-2}"
  [[ -n "$RAY" ]] || die "no ray command; run \`make venv\` (or pip install 'ray[default]') first"
  [[ -z "$(live_pids)" ]] || die "already up ($SESSIONS); run: $0 down"
  if [[ -e "$DIR" && ! -e "$DIR/.flexbatch-cluster" && -n "$(ls -A "$DIR")" ]]; then
    die "$DIR exists and was not made by this script; set FLEXBATCH_CLUSTER_DIR to a new folder"
  fi
  rm -rf "$DIR" && mkdir -p "$DIR" && touch "$DIR/.flexbatch-cluster"
  if [[ -z "${RAY_AUTH_TOKEN:-}${RAY_AUTH_TOKEN_PATH:-}" ]]; then
    "$RAY" get-auth-token --generate >/dev/null   # ~/.ray/auth_token, kept if it exists
  fi
  start_node head --head --node-ip-address=127.0.0.1 --port="$RAY_PORT" --num-cpus="$HEAD_CPUS" \
    --dashboard-host=127.0.0.1 --dashboard-port="$DASHBOARD_PORT" --dashboard-agent-listen-port="$AGENT_PORT"
  for i in $(seq "$workers"); do
    start_node "w$i" --address="127.0.0.1:$RAY_PORT" --node-ip-address=127.0.0.1 --num-cpus="$WORKER_CPUS" \
      --dashboard-agent-listen-port=$((AGENT_PORT + i))
  done
  wait_for_job_server
  cat <<EOF
Ray cluster up: head (${HEAD_CPUS} CPU) + $workers workers (${WORKER_CPUS} CPU each), token auth on; state in $DIR
  export RAY_AUTH_MODE=token               # clients need the mode, and the token (~/.ray/auth_token)
  export RAY_ADDRESS=127.0.0.1:$RAY_PORT   # for ray status, ray.init(), flexbatch run
  dashboard / job server: http://127.0.0.1:$DASHBOARD_PORT
  submit: flexbatch submit --address http://127.0.0.1:$DASHBOARD_PORT -- \\
            --input examples/prompts.parquet --output /tmp/flexbatch-out --max-new-tokens 8 --overwrite
  stop:   $0 down
EOF
}

# Stop the cluster's running jobs through its job server: a job's driver runs in a process session of its
# own and would otherwise outlive the cluster by a minute (until it gives up on the GCS).
STOP_JOBS_PY='
import sys, time
from ray.job_submission import JobSubmissionClient
client = JobSubmissionClient(sys.argv[1])
running = [j.submission_id for j in client.list_jobs() if j.submission_id and not j.status.is_terminal()]
for job_id in running:
    client.stop_job(job_id)
deadline = time.monotonic() + 20
while running and time.monotonic() < deadline:
    time.sleep(0.5)
    running = [j for j in running if not client.get_job_status(j).is_terminal()]
sys.exit(1 if running else 0)
'
stop_jobs() {
  "$PY" -c "$STOP_JOBS_PY" "http://127.0.0.1:$DASHBOARD_PORT" >/dev/null 2>&1 ||
    echo "local_cluster: could not stop every running job; killing the cluster anyway" >&2
}

# Job drivers that outlived their job: processes whose working directory is a job's working_dir copy
# inside this cluster's folder.
stray_pids() {
  local p
  for p in /proc/[0-9]*; do
    [[ "$(readlink "$p/cwd" 2>/dev/null)" == "$DIR"/*/session_*/runtime_resources/* ]] && echo "${p#/proc/}"
  done
  return 0
}

down() {
  local pids
  [[ -z "$(live_pids)" ]] || stop_jobs
  pids="$(live_pids)"
  if [[ -n "$pids" ]]; then
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    for _ in $(seq 15); do [[ -z "$(live_pids)" ]] && break; sleep 1; done
    pids="$(live_pids) $(stray_pids)"
    # shellcheck disable=SC2086
    [[ -z "${pids// /}" ]] || kill -KILL $pids 2>/dev/null || true
    sleep 1
  fi
  [[ -z "$(live_pids)" ]] || die "processes still alive: $(live_pids | tr '\n' ' ')"
  rm -f "$SESSIONS"
  echo "Ray cluster in $DIR is down"
}

status() {
  [[ -n "$(live_pids)" ]] || die "not up (no live processes recorded in $SESSIONS); run: $0 up"
  "$RAY" status --address="127.0.0.1:$RAY_PORT"
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  status) status ;;
  *) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
