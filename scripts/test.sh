#!/usr/bin/env bash
# The one test command (make test; CI's .ci/run). Installs what the tests
# need when it is missing, then runs every test with the race detector
# (which needs cgo, so a C compiler: installed like redis-server; without
# one the tests run without -race, and the script says so).
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local

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
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing ${need_apt[*]} with apt-get" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
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
# 127.0.0.1:5432 (user postgres, trust auth) when one answers; else, as
# root, install PostgreSQL, start its cluster and give user postgres a
# password for TCP logins. ALLOT_REQUIRE_POSTGRES=1 (tests fail rather than
# skip) is set only once a server answered.
pg_ok() { command -v psql >/dev/null 2>&1 && PGCONNECT_TIMEOUT=3 psql "$1" -qtAc 'select 1' >/dev/null 2>&1; }
start_postgres() {
  if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    echo "installing postgresql with apt-get" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null || return 1
  fi
  if [ -z "$(pg_lsclusters -h 2>/dev/null)" ]; then
    pg_createcluster "$(ls /usr/lib/postgresql | sort -V | tail -1)" main >/dev/null || return 1
  fi
  local ver name port status
  read -r ver name port status _ < <(pg_lsclusters -h | head -1)
  if [ "$status" != online ]; then
    pg_ctlcluster "$ver" "$name" start || return 1
  fi
  runuser -u postgres -- psql -p "$port" -qc "ALTER USER postgres PASSWORD 'allot-test'" >/dev/null || return 1
  pg_url="postgres://postgres:allot-test@127.0.0.1:${port}/postgres?sslmode=disable"
}
pg_url="${ALLOT_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}"
if ! pg_ok "$pg_url" && [ -z "${ALLOT_TEST_POSTGRES:-}" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  start_postgres || echo "could not install or start PostgreSQL" >&2
fi
if pg_ok "$pg_url"; then
  export ALLOT_TEST_POSTGRES="$pg_url" ALLOT_REQUIRE_POSTGRES=1
else
  echo "PostgreSQL not available: its tests will skip (install postgresql or set ALLOT_TEST_POSTGRES)" >&2
fi
go vet ./...
go test $race -count=1 -timeout 10m ./...
# Deploy checks (deploy/check, a module of its own so that k8s.io/api,
# the OpenTelemetry Collector and the pinned Helm and promtool stay out of
# the main module's build): the Helm chart rendered and strictly decoded,
# the dashboards and alert rules against the metrics a running node
# exports, traces received by a real OTLP receiver. docs/deploy.md.
# About 30 s with a warm build cache; with an empty one about 10 min on
# two cores, most of it building the pinned Helm and promtool once.
(cd deploy/check && go vet ./... && go test $race -count=1 -timeout 15m ./...)
# The chaos suite against the 3-region sandbox (about 1.5 min): a system
# test, run without -race so its latency figures mean something.
go test -tags chaos -count=1 -timeout 10m ./internal/tools/chaos/
