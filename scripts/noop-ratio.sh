#!/usr/bin/env bash
# noop-ratio.sh: a node's single-check rate against the project's no-op
# gRPC server (allot-load --noop-listen), same generator, same run,
# alternated ROUNDS times: no-op, node, no-op, node, ... Prints one line
# per pair with both rates, the ratio, and the CPU per call of the node,
# its redis-server and the no-op server (from /proc/PID/stat), then the
# mean and range of the ratios. Starts its own redis-server, node and
# no-op server on free ports.
#
#   make build && flock /tmp/allot-cpu.lock scripts/noop-ratio.sh MODE [rounds] [seconds] [workers]
#
# MODE: exact     10,000 tenants, huge limit, precision exact, on Redis
#       leased    one hot tenant, huge limit, precision leased, on Redis
#       standalone 10,000 tenants, huge limit, in-process counters (no Redis)
# NODE_BIN=path measures another build; NODE_ARGS adds node flags.
set -euo pipefail
mode=${1:?mode: exact, leased or standalone}
rounds=${2:-3}
secs=${3:-8}
workers=${4:-32}
load=${LOAD_BIN:-bin/allot-load}
dir=$(mktemp -d)
. "$(dirname "$0")/lib.sh"
rport=$(free_port); gport=$(free_port); nport=$(free_port)
precision=exact keys=(--keys uniform --key-count 10000)
case $mode in
exact) ;;
leased) precision=leased keys=(--keys uniform --key-count 1) ;;
standalone) ;;
*) echo "unknown mode $mode" >&2; exit 2 ;;
esac
cat >"$dir/policies.yaml" <<EOF
policies:
  - id: ratio
    match: {}
    per: [tenant]
    limits:
      - {name: l, algorithm: token_bucket, limit: 1000000000, period: 1s, burst: 1000000000}
    precision: $precision
    on_store_failure: open
EOF
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
redis=()
rpid=
if [ "$mode" != standalone ]; then
  start_redis "$rport" "$dir"
  pids+=("$rpid")
  redis=(--redis "127.0.0.1:$rport")
fi
# shellcheck disable=SC2086
"${NODE_BIN:-bin/allot-node}" "${redis[@]}" --grpc-addr "127.0.0.1:$gport" --http-addr '' \
  --policies "$dir/policies.yaml" ${NODE_ARGS:-} >"$dir/node.log" 2>&1 &
npid=$!; pids+=("$npid")
"$load" --noop-listen "127.0.0.1:$nport" >"$dir/noop.log" 2>&1 &
opid=$!; pids+=("$opid")
sleep 2
cpu() { if [ -n "$1" ]; then awk '{print $14+$15}' "/proc/$1/stat"; else echo 0; fi; }
gen() { # target -> decisions/s; fails on any FAILED_OPEN or failed answer
  local out
  out=$("$load" --target "$1" --concurrency "$workers" --duration "${secs}s" "${keys[@]}" --key-field tenant --quiet 2>&1)
  if ! grep -q "failed open 0), throttled [0-9]*, failed 0" <<<"$out"; then
    echo "answers not all decided: $out" >&2; exit 1
  fi
  grep -oE '[0-9.]+ req/s' <<<"$out" | cut -d' ' -f1
}
tck=$(getconf CLK_TCK)
"$load" --target "127.0.0.1:$gport" --concurrency "$workers" --duration 2s "${keys[@]}" --key-field tenant --quiet >/dev/null 2>&1 # warm-up
echo "mode $mode, $workers workers, ${secs}s per run, load average $(cut -d' ' -f1-3 /proc/loadavg)"
ratios=()
for r in $(seq "$rounds"); do
  o0=$(cpu "$opid"); noop=$(gen "127.0.0.1:$nport"); o1=$(cpu "$opid")
  n0=$(cpu "$npid"); r0=$(cpu "$rpid"); node=$(gen "127.0.0.1:$gport"); n1=$(cpu "$npid"); r1=$(cpu "$rpid")
  line=$(awk -v r="$r" -v o="$noop" -v n="$node" -v s="$secs" -v t="$tck" -v oc=$((o1-o0)) -v nc=$((n1-n0)) -v rc=$((r1-r0)) \
    'BEGIN{printf "%d: no-op %.0f/s, node %.0f/s, ratio %.3f; CPU per call: node %.1f µs, redis %.1f µs, no-op %.1f µs", r, o, n, n/o, nc/t*1e6/(n*s), rc/t*1e6/(n*s), oc/t*1e6/(o*s)}')
  echo "$line (load $(cut -d' ' -f1 /proc/loadavg))"
  ratios+=("$(awk -v o="$noop" -v n="$node" 'BEGIN{printf "%.3f", n/o}')")
done
printf '%s\n' "${ratios[@]}" | awk '{s+=$1; if(NR==1||$1<lo)lo=$1; if(NR==1||$1>hi)hi=$1} END{printf "ratio mean %.3f, range %.3f-%.3f over %d rounds\n", s/NR, lo, hi, NR}'
grep -iE "breaker|stall" "$dir/node.log" | head -5 || true
