#!/bin/sh
# One-shot: joins a region's three Redis servers into a 3-master Redis
# Cluster (no replicas). Idempotent: exits 0 when the cluster is already
# formed (a re-run of `docker compose up`). CLUSTER MEET takes IP
# addresses, so the service names are resolved first.
# Usage: redis-cluster-init.sh HOST1 HOST2 HOST3
set -eu
if redis-cli -h "$1" cluster info | grep -q '^cluster_state:ok'; then
  echo "redis cluster of $* already formed"
  exit 0
fi
addrs=""
for h in "$@"; do
  ip=$(getent hosts "$h" | awk '{print $1; exit}')
  [ -n "$ip" ] || { echo "cannot resolve $h" >&2; exit 1; }
  addrs="$addrs $ip:6379"
done
# shellcheck disable=SC2086 # addrs is a list
redis-cli --cluster create $addrs --cluster-replicas 0 --cluster-yes
