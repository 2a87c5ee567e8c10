#!/usr/bin/env bash
# The one test command (make test; CI's .ci/run). Installs what the tests
# need when it is missing, then runs every test with the race detector.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need_apt+=(redis-tools)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing ${need_apt[*]} with apt-get" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "missing ${need_apt[*]}: install them (e.g. sudo apt-get install redis-server) and rerun" >&2
    exit 1
  fi
fi

# Tests start their own redis-server processes on free ports; with this set
# they fail rather than skip when redis-server is missing.
export ALLOT_REQUIRE_REDIS=1
go vet ./...
go test -race -count=1 -timeout 10m ./...
