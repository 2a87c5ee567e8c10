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
	failures := fs.Int("breaker-failures", region.DefaultBreakerFailures, "circuit breaker: failed round trips in a row that open a shard's breaker (a stall opens it at once); negative: only stalls")
	maxOpen := fs.Duration("breaker-max-open", region.DefaultBreakerMaxOpen, "circuit breaker: longest wait between probes (PING) of an open breaker; the first comes after 50ms, each failed one doubles the wait")
	return func() node.Resilience {
		return node.Resilience{
			RedisTimeout: *timeout,
			Breaker:      region.BreakerOptions{Failures: *failures, MaxOpen: *maxOpen},
		}
	}
}
