#!/usr/bin/env bash
# The one test command (make test; CI's .ci/run). Installs what the tests
# need when it is missing, then runs every test with the race detector
# (which needs cgo, so a C compiler: installed like redis-server; without
# one the tests run without -race, and the script says so).
#
# It prints what a reader should act on (go's package lines and failures,
# what it installs, what is missing); apt's and PostgreSQL's chatter goes
# to a log shown only when a step fails. What it starts itself (a
# PostgreSQL cluster, a redis-server apt started on install) it stops on
# the way out; services already running when it began are reused and left
# running.
#
# go's output streams as usual and is also kept in a log under
# ${TMPDIR:-/tmp}; when a step fails, the last lines name the failing
# tests and packages, the machine's load average (a loaded machine is
# said to be one: a starved test fails on time, not on logic) and where
# that log is. A run that passes removes it.
#
# ALLOT_TEST_PLAN_ONLY=1: print what it would install, touch nothing.
# ALLOT_TEST_SUMMARY=LOG: print the failure summary of a go test log
# (what a failing run prints last), touch nothing.
# ALLOT_TEST_SETUP_ONLY=1: install and start what the tests need, print
# the PostgreSQL URL, then stop what it started; run no test.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local

# summarize prints what failed in a go test log (stdin): each failing
# test with its package, each failing package (a build failure or a
# timeout included), then the machine's load and the log's path ($1).
summarize() {
  awk '
    /^panic: test timed out after/ { timeout = 1; next }
    timeout && /^running tests:/ { running = 1; next }
    running && /^\t+Test/ { sub(/^\t+/, ""); tests[++n] = $1 " (still running at the timeout)"; next }
    { running = 0 }
    /^ *--- FAIL: / { t = $0; sub(/^ *--- FAIL: /, "", t); tests[++n] = t; next }
    /^(ok|FAIL|\?) *\t/ {
      if ($1 == "FAIL" && $2 != "") {
        pkg = $2; extra = ($3 ~ /^\[/) ? " " $3 " " $4 : ""
        pkgs = pkgs "  " pkg extra (timeout ? " (timed out)" : "") "\n"
        for (i = 1; i <= n; i++) named = named "  " tests[i] "  [" pkg "]\n"
      }
      n = 0; timeout = 0
    }
    END {
      if (named != "") printf "failing tests:\n%s", named
      if (pkgs != "") printf "failing packages:\n%s", pkgs
      if (named == "" && pkgs == "") print "no failing test named in the output: see the log"
    }'
  local cpus l1 l5 l15 rest
  cpus=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
  if read -r l1 l5 l15 rest </proc/loadavg 2>/dev/null; then
    if awk -v a="$l1" -v b="$l5" -v c="$cpus" 'BEGIN { exit !(a > c || b > c) }'; then
      echo "load average $l1 $l5 $l15 on $cpus CPUs: the machine was loaded, more runnable work than CPUs; a test that failed on a deadline or a wall-clock window may have been starved rather than wrong: rerun it alone"
    else
      echo "load average $l1 $l5 $l15 on $cpus CPUs: not loaded"
    fi
  fi
  echo "full log: $1"
}
if [ -n "${ALLOT_TEST_SUMMARY:-}" ]; then
  summarize "$ALLOT_TEST_SUMMARY" <"$ALLOT_TEST_SUMMARY"
  exit 0
fi

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need_apt+=(redis-tools)
have_cc() { command -v "$(go env CC)" >/dev/null 2>&1; }
have_cc || need_apt+=(gcc libc6-dev)
if [ -n "${ALLOT_TEST_PLAN_ONLY:-}" ]; then
  # What this machine lacks and whether -race could run now, without
  # installing or testing anything (scripts/plan_test.go).
  echo "install: ${need_apt[*]:-nothing}"
  if have_cc; then echo "race: on"; else echo "race: off until a C compiler is installed"; fi
  exit 0
fi

# The setup log: apt, pg_createcluster, pg_ctlcluster and go mod download
# write here; a failing step prints it.
setup_log=$(mktemp "${TMPDIR:-/tmp}/allot-test-setup.XXXXXX")
fail_log() { echo "--- $1 failed; its output:" >&2; cat "$setup_log" >&2; }

# What to stop on the way out: PostgreSQL clusters (VER/NAME) and services
# (init names) that were not running when the script began.
pg_before=()   # clusters online before the script touched PostgreSQL
pg_touched=    # set once start_postgres began
redis_by_apt=  # set when installing redis-server started one on port 6379
test_log=      # go's output, kept when a step fails
test_log_part= # the failing step's part of it
failed_step=   # the step that failed, for the summary
cleanup() {
  local rc=$?
  set +e
  if [ -n "$pg_touched" ]; then
    local c
    for c in $(pg_online); do
      if ! printf '%s\n' "${pg_before[@]}" | grep -qxF "$c"; then
        (cd / && pg_ctlcluster "${c%%/*}" "${c#*/}" stop) >>"$setup_log" 2>&1 ||
          echo "could not stop PostgreSQL cluster $c (pg_ctlcluster ${c%%/*} ${c#*/} stop)" >&2
      fi
    done
  fi
  if [ -n "$redis_by_apt" ]; then # the tests start redis-servers of their own
    stop_service redis-server || redis-cli -p 6379 shutdown nosave >>"$setup_log" 2>&1 ||
      echo "could not stop the redis-server apt started on port 6379" >&2
  fi
  rm -f "$setup_log"
  if [ -n "$test_log" ] && [ "$rc" = 0 ]; then
    rm -f "$test_log"
  elif [ -n "$failed_step" ]; then
    # Last, so that it is what a reader sees.
    echo "--- make test FAILED in $failed_step (exit $rc)"
    summarize "$test_log" <"$test_log_part"
  elif [ -n "$test_log" ]; then
    echo "--- make test stopped (exit $rc); go's output so far: $test_log"
  fi
  [ -z "$test_log_part" ] || rm -f "$test_log_part"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# redis_up: something listens on 127.0.0.1:6379 (redis-cli may be absent).
redis_up() { (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; }
# stop_service stops an init service the way this machine runs them.
stop_service() {
  if [ -d /run/systemd/system ]; then
    systemctl stop "$1" >>"$setup_log" 2>&1
  elif command -v service >/dev/null 2>&1; then
    service "$1" stop >>"$setup_log" 2>&1
  else
    return 1
  fi
}

# apt_install installs packages quietly (its output to the setup log).
apt_updated=
apt_install() {
  echo "installing $* with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  if [ -z "$apt_updated" ]; then
    apt-get update -qq >>"$setup_log" 2>&1 || { fail_log "apt-get update"; return 1; }
    apt_updated=1
  fi
  apt-get install -y -qq --no-install-recommends "$@" >>"$setup_log" 2>&1 ||
    { fail_log "apt-get install $*"; return 1; }
}

if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    redis_before=
    if redis_up; then redis_before=1; fi
    apt_install "${need_apt[@]}"
    if [[ " ${need_apt[*]} " == *" redis-server "* ]] && [ -z "$redis_before" ] && redis_up; then
      redis_by_apt=1
    fi
  elif command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
    echo "missing ${need_apt[*]} (not root or no apt-get): continuing without them" >&2
  else
    echo "missing ${need_apt[*]}: install them (e.g. sudo apt-get install redis-server gcc) and rerun" >&2
    exit 1
  fi
fi
race=-race
if ! have_cc; then
  race=
  echo "no C compiler ($(go env CC)): -race needs cgo, so the tests run WITHOUT the race detector; install gcc to enable it" >&2
fi

# Tests start their own redis-server processes on free ports; with this set
# they fail rather than skip when redis-server is missing.
export ALLOT_REQUIRE_REDIS=1

# PostgreSQL for the policy-store tests (each test creates and drops its own
# database; see internal/testenv/pgtest). Use ALLOT_TEST_POSTGRES or a server at
# 127.0.0.1:5432 (ALLOT_TEST_PG_PORT; user postgres, trust auth, or the
# password this script sets on a cluster it starts) when one answers; else,
# as root, install PostgreSQL, start a cluster on that port (stopped again
# on the way out) and give user postgres a password for TCP logins.
# ALLOT_REQUIRE_POSTGRES=1 (tests fail rather than skip) is set only once a
# server answered. PostgreSQL's tools run from / : as user postgres they
# cannot enter a checkout under /root.
pg_port="${ALLOT_TEST_PG_PORT:-5432}"
pg_pass_url="postgres://postgres:allot-test@127.0.0.1:${pg_port}/postgres?sslmode=disable"
pg_ok() { command -v psql >/dev/null 2>&1 && PGCONNECT_TIMEOUT=3 psql "$1" -qtAc 'select 1' >/dev/null 2>&1; }
pg_online() { pg_lsclusters -h 2>/dev/null | awk '$4 == "online" {print $1 "/" $2}'; }
start_postgres() {
  if command -v pg_lsclusters >/dev/null 2>&1; then
    mapfile -t pg_before < <(pg_online)
  fi
  pg_touched=1
  if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    apt_install postgresql || return 1
  fi
  local ver name status line
  line=$(pg_lsclusters -h 2>/dev/null | awk -v p="$pg_port" '$3 == p {print $1, $2, $4; exit}')
  if [ -z "$line" ]; then
    ver=$(ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -1)
    [ -n "$ver" ] || { echo "no PostgreSQL server under /usr/lib/postgresql: install postgresql" >&2; return 1; }
    name=main
    if [ -d "/etc/postgresql/$ver/main" ]; then name=allot-test; fi
    (cd / && pg_createcluster -p "$pg_port" "$ver" "$name") >>"$setup_log" 2>&1 ||
      { fail_log "pg_createcluster $ver $name"; return 1; }
    status=down
  else
    read -r ver name status <<<"$line"
  fi
  if [ "$status" != online ]; then
    (cd / && pg_ctlcluster "$ver" "$name" start) >>"$setup_log" 2>&1 ||
      { fail_log "pg_ctlcluster $ver $name start"; return 1; }
  elif printf '%s\n' "${pg_before[@]}" | grep -qxF "$ver/$name"; then
    # Running before this script, and neither URL logs in: leave it as
    # it is (no new password on someone else's server).
    echo "PostgreSQL cluster $ver/$name on port $pg_port refuses user postgres over TCP: set ALLOT_TEST_POSTGRES to a URL that logs in" >&2
    return 1
  fi
  (cd / && runuser -u postgres -- psql -p "$pg_port" -qc "ALTER USER postgres PASSWORD 'allot-test'") >>"$setup_log" 2>&1 ||
    { fail_log "setting user postgres's password"; return 1; }
  pg_url=$pg_pass_url
}
pg_url="${ALLOT_TEST_POSTGRES:-postgres://postgres@127.0.0.1:${pg_port}/test?sslmode=disable}"
if ! pg_ok "$pg_url" && [ -z "${ALLOT_TEST_POSTGRES:-}" ]; then
  if pg_ok "$pg_pass_url"; then
    pg_url=$pg_pass_url # a cluster an earlier run set up, running
  elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    start_postgres || true # it said why
  fi
fi
if pg_ok "$pg_url"; then
  export ALLOT_TEST_POSTGRES="$pg_url" ALLOT_REQUIRE_POSTGRES=1
else
  echo "PostgreSQL not available: its tests will skip (install postgresql or set ALLOT_TEST_POSTGRES)" >&2
fi
if [ -n "${ALLOT_TEST_SETUP_ONLY:-}" ]; then
  echo "postgres: ${ALLOT_TEST_POSTGRES:-none}"
  exit 0
fi

# Modules first, quietly: go vet and go test would print a "go:
# downloading" line for each on a fresh machine.
{ go mod download && (cd deploy/check && go mod download); } >>"$setup_log" 2>&1 ||
  { fail_log "go mod download"; exit 1; }
test_log=$(mktemp "${TMPDIR:-/tmp}/allot-test-$(date +%Y%m%d-%H%M%S).XXXXXX.log")
test_log_part=$(mktemp "${TMPDIR:-/tmp}/allot-test-step.XXXXXX")
# step NAME DIR CMD...: runs CMD in DIR, its output shown as it comes
# and added to the log; a failure ends the script (the summary is
# printed on the way out).
step() {
  local name=$1 dir=$2 rc=0
  shift 2
  (cd "$dir" && "$@") 2>&1 | tee "$test_log_part" || rc=$?
  cat "$test_log_part" >>"$test_log"
  if [ "$rc" != 0 ]; then
    failed_step=$name
    exit "$rc"
  fi
}
step "go vet" . go vet ./...
step "go test" . go test $race -count=1 -timeout 10m ./...
# Deploy checks (deploy/check, a module of its own so that k8s.io/api,
# the OpenTelemetry Collector and the pinned Helm and promtool stay out of
# the main module's build): the Helm chart rendered and strictly decoded,
# the dashboards and alert rules against the metrics a running node
# exports, traces received by a real OTLP receiver. docs/deploy.md.
# About 30 s with a warm build cache; with an empty one about 10 min on
# two cores, most of it building the pinned Helm and promtool once.
step "go vet (deploy/check)" deploy/check go vet ./...
step "go test (deploy/check)" deploy/check go test $race -count=1 -timeout 15m ./...
# The chaos suite against the 3-region sandbox (about 1.5 min): a system
# test, run without -race so its latency figures mean something.
step "the chaos suite" . go test -tags chaos -count=1 -timeout 10m ./internal/tools/chaos/
