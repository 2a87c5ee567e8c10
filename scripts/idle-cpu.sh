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
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rport=$(free_port); gport=$(free_port); hport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" >"$dir/redis.log" 2>&1 &
rpid=$!
node_pid=
cleanup() { [ -n "$node_pid" ] && kill "$node_pid" 2>/dev/null; kill "$rpid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
"${NODE_BIN:-bin/allot-node}" --redis "127.0.0.1:$rport" --grpc-addr "127.0.0.1:$gport" --http-addr "127.0.0.1:$hport" \
  --policies "$policies" >"$dir/node.log" 2>&1 &
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
