# lib.sh: helpers the measurement scripts share (source it).

# free_port prints a TCP port free on 127.0.0.1 now.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_redis PORT DIR starts a throwaway redis-server (no persistence,
# log in DIR) in the background, sets rpid to its PID and waits until it
# answers PING.
start_redis() {
  redis-server --port "$1" --bind 127.0.0.1 --save '' --appendonly no --dir "$2" >"$2/redis.log" 2>&1 &
  rpid=$!
  for _ in $(seq 50); do redis-cli -p "$1" ping >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "redis-server on port $1 did not answer" >&2
  return 1
}
