#!/usr/bin/env bash
# idle-cpu.sh: CPU an idle node uses. Starts its own redis-server and a
# node (bin/allot-node, built first) on free ports with a policy file, lets
# them settle, then reads the node's utime+stime from /proc/PID/stat over
# a window and prints ms of CPU per second and % of one core.
#
#   make build && flock /tmp/allot-cpu.lock scripts/idle-cpu.sh [seconds] [policy file]
#
# NODE_BIN=path measures another build (e.g. of an older commit).
set -euo pipefail
secs=${1:-30}
policies=${2:-examples/policies.yaml}
dir=$(mktemp -d)
. "$(dirname "$0")/lib.sh"
rport=$(free_port); gport=$(free_port); hport=$(free_port)
node_pid= rpid=
# Every step runs whatever the one before it returned: under set -e a
# failed kill (the node already gone) would leave redis-server running.
cleanup() {
	[ -z "$node_pid" ] || kill "$node_pid" 2>/dev/null || true
	[ -z "$rpid" ] || kill "$rpid" 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$dir"
}
trap cleanup EXIT
start_redis "$rport" "$dir"
"${NODE_BIN:-bin/allot-node}" --redis "127.0.0.1:$rport" --grpc-addr "127.0.0.1:$gport" --http-addr "127.0.0.1:$hport" \
  --store "$policies" >"$dir/node.log" 2>&1 &
node_pid=$!
sleep 3 # start-up work is not idle
tck=$(getconf CLK_TCK)
cpu() { awk '{print $14+$15}' "/proc/$node_pid/stat"; }
a=$(cpu); t0=$(date +%s.%N)
sleep "$secs"
b=$(cpu); t1=$(date +%s.%N)
python3 - "$a" "$b" "$t0" "$t1" "$tck" <<'PY'
import sys
a, b, t0, t1, tck = map(float, sys.argv[1:])
ms = (b - a) / tck * 1000 / (t1 - t0)
print(f"idle node: {ms:.1f} ms CPU/s = {ms/10:.2f} % of a core over {t1-t0:.0f} s")
PY
echo "loadavg: $(cat /proc/loadavg)"
