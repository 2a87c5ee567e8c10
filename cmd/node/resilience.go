package main

import (
	"flag"

	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/region"
)

// resilienceFlags declares the flags of node.Resilience (Redis deadlines,
// circuit breakers; gossip is in gossip.go) and returns a function
// that reads them after parsing.
func resilienceFlags(fs *flag.FlagSet) func() node.Resilience {
	timeout := fs.Duration("redis-timeout", region.DefaultTimeout, "budget of a decision waiting on a Redis shard that stopped answering, its on_store_failure decision included: a shard whose connection had no byte of reply for this less 1ms since it last wrote, with nothing received unread, is stalled; its calls are decided by on_store_failure and its breaker opens")
	maxWait := fs.Duration("redis-max-wait", region.DefaultMaxWait, "longest a check (or a lease refill) waits for this node to get an answer from a healthy Redis shard, queue included, before it is shed: UNAVAILABLE (HTTP 503) \"node overloaded\", never decided as a store failure")
	failures := fs.Int("breaker-failures", region.DefaultBreakerFailures, "circuit breaker: failed round trips in a row that open a shard's breaker (a stall opens it at once); negative: only stalls")
	probeAfter := fs.Duration("breaker-probe-after", region.DefaultBreakerProbeAfter, "circuit breaker: wait before the first probe (PING) of an open breaker; each failed probe doubles the wait")
	maxOpen := fs.Duration("breaker-max-open", region.DefaultBreakerMaxOpen, "circuit breaker: longest wait between probes of an open breaker")
	return func() node.Resilience {
		return node.Resilience{
			RedisTimeout: *timeout,
			RedisMaxWait: *maxWait,
			Breaker:      region.BreakerOptions{Failures: *failures, ProbeAfter: *probeAfter, MaxOpen: *maxOpen},
		}
	}
}
