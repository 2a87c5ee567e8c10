#!/usr/bin/env bash
# noop-ratio.sh: a node's single-check rate against the project's no-op
# gRPC server, same generator, same run, alternated ROUNDS times; now a
# wrapper of `allot-load ratio` (internal/tools/loadgen/sweep/ratio.go), kept
# so that the commands of docs/performance.md ("Single check") run as written.
#
#   make build && flock /tmp/allot-cpu.lock scripts/noop-ratio.sh MODE [rounds] [seconds] [workers]
#
# MODE: exact, leased or standalone (allot-load ratio --help).
# NODE_BIN=path measures another build; NODE_ARGS adds node flags.
set -euo pipefail
mode=${1:?mode: exact, leased or standalone}
exec "${LOAD_BIN:-bin/allot-load}" ratio --mode "$mode" --pairs "${2:-3}" --measure "${3:-8}s" \
  --concurrency "${4:-32}" --node-bin "${NODE_BIN:-bin/allot-node}" --node-args "${NODE_ARGS:-}"
