#!/bin/sh
# Checks a running deploy/multi-region deployment end to end:
#   1. every node answers /readyz on its published HTTP port;
#   2. in every region one coordinator is active and hears all three
#      regions (its reports crossed the NATS gateways);
#   3. a hot key under load from inside the compose network, 1500 req/s
#      split over the three regions and shifting to us, is admitted at
#      about the global limit (300/s, burst 600: not 3 x 300/s);
#   4. us's share of that key in its Redis grew past L/n = 100/s (the
#      coordinators moved the share to where the traffic went).
#
#   docker compose -f deploy/multi-region/docker-compose.yml up --build -d
#   sh deploy/multi-region/verify.sh        # about a minute
#
# Needs curl. Exits non-zero on the first failed check.
set -eu
cd "$(dirname "$0")"
dc() { docker compose -f docker-compose.yml "$@"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

echo "== nodes ready"
for port in 8080 8180 9080 9180 10080 10180; do
  ok=""
  for _ in $(seq 30); do
    if curl -fsS -m 2 "http://127.0.0.1:$port/readyz" >/dev/null 2>&1; then ok=1; break; fi
    sleep 1
  done
  [ -n "$ok" ] || fail "node on 127.0.0.1:$port is not ready"
  echo "127.0.0.1:$port ready"
done

# metric PORT NAME: the value of an unlabelled metric, empty if absent.
metric() { curl -fsS -m 2 "http://127.0.0.1:$1/metrics" 2>/dev/null | awk -v n="$2" '$1 == n {print $2}'; }

echo "== coordinators (one active per region, hearing 3 regions)"
for r in us:8470 eu:9470 ap:10470; do
  region=${r%%:*} port=${r#*:}
  heard=""
  # The first epoch after start only listens: allow two 10 s intervals.
  for _ in $(seq 30); do
    for p in "$port" $((port + 1)); do
      h=$(metric "$p" allot_rebalance_regions_heard)
      [ "${h:-0}" = 3 ] && heard=$p
    done
    [ -n "$heard" ] && break
    sleep 1
  done
  [ -n "$heard" ] || fail "no coordinator of $region heard all 3 regions (metrics on 127.0.0.1:$port and $((port + 1)))"
  echo "$region: active coordinator's metrics on 127.0.0.1:$heard, regions heard 3, rounds $(metric "$heard" allot_rebalance_rounds_total)"
done

echo "== global limit across regions (40 s of load)"
out=$(dc --profile load run --rm -T load \
  --target=us=node-us-1:8081,eu=node-eu-1:8081,ap=node-ap-1:8081 \
  --rate=1500 --duration=40s --keys=hot \
  --split=us=0.34,eu=0.33,ap=0.33 --shift-at=10s --shift-split=us=0.9,eu=0.05,ap=0.05 \
  --ideal-rate=300/s --ideal-burst=600 --quiet 2>&1) || { echo "$out"; fail "allot-load failed"; }
echo "$out"
pct=$(echo "$out" | sed -n 's/.*admitted [0-9]* = \([0-9.]*\)% of ideal.*/\1/p')
[ -n "$pct" ] || fail "no 'of ideal' line in the load report"
# Unshared, three regions would admit about 300% of the ideal.
awk -v p="$pct" 'BEGIN { exit !(p <= 125) }' || fail "admitted $pct% of the global limit (> 125%)"
echo "admitted $pct% of the global limit"

echo "== us's share of the hot key"
rate=$(dc exec -T redis-us-1 redis-cli -c hget 'rl:{client=k0}:api-key-global:per_second' rate | tr -d '\r')
[ -n "$rate" ] || fail "no share written for the hot key in us's Redis"
awk -v r="$rate" 'BEGIN { exit !(r > 110) }' || fail "us's share is $rate/s, not above L/n = 100/s"
echo "us enforces $rate/s of the global 300/s"
echo "OK"
