package main

import (
	"flag"
	"time"

	"github.com/allot-dev/allot/internal/membership"
	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/region"
)

// resilienceFlags declares the flags of node.Resilience (Redis deadlines,
// circuit breakers, local fallback sizing, gossip) and returns a function
// that reads them after parsing.
func resilienceFlags(fs *flag.FlagSet) func() node.Resilience {
	timeout := fs.Duration("redis-timeout", region.DefaultTimeout, "budget of a decision waiting on a Redis shard that stopped answering: a shard whose oldest pipeline waited this (less 1 ms) while nothing arrived from it, no reply waits unread and this process ran on time, is stalled; its calls are decided by on_store_failure and its breaker opens")
	maxWait := fs.Duration("redis-max-wait", region.DefaultMaxWait, "longest a check (or a lease refill) waits for this node to get an answer from a healthy Redis shard, queue included, before it is shed: UNAVAILABLE (HTTP 503) \"node overloaded\", never decided as a store failure")
	failures := fs.Int("breaker-failures", region.DefaultBreakerFailures, "circuit breaker: failed round trips in a row that open a shard's breaker (a stall opens it at once); negative: only stalls")
	probeAfter := fs.Duration("breaker-probe-after", region.DefaultBreakerProbeAfter, "circuit breaker: wait before the first probe (PING) of an open breaker; each failed probe doubles the wait")
	maxOpen := fs.Duration("breaker-max-open", region.DefaultBreakerMaxOpen, "circuit breaker: longest wait between probes of an open breaker")
	gossip := fs.String("gossip-addr", "", "memberlist gossip listen address HOST:PORT (TCP and UDP); empty disables gossip and the local fallback divides limits by --gossip-floor")
	advertise := fs.String("gossip-advertise", "", "gossip address other nodes reach this one on (default: --gossip-addr's host)")
	seeds := fs.String("gossip-seeds", "", "comma-separated gossip addresses of other nodes of the region")
	floor := fs.Int("gossip-floor", membership.DefaultFloor, "least N the local fallback divides limits by, whatever gossip sees (a node alone never takes the whole limit)")
	name := fs.String("gossip-name", "", "unique node name in the region (default: address and start time)")
	probe := fs.Duration("gossip-probe-interval", 500*time.Millisecond, "gossip: how often a node probes another; failure detection takes a few of these")
	suspicion := fs.Int("gossip-suspicion-mult", 4, "gossip: a suspect node is declared dead after about this many probe intervals (times log10 N)")
	return func() node.Resilience {
		return node.Resilience{
			RedisTimeout:        *timeout,
			RedisMaxWait:        *maxWait,
			Breaker:             region.BreakerOptions{Failures: *failures, ProbeAfter: *probeAfter, MaxOpen: *maxOpen},
			GossipAddr:          *gossip,
			GossipAdvertise:     *advertise,
			GossipSeeds:         splitList(*seeds),
			GossipFloor:         *floor,
			GossipName:          *name,
			GossipProbeInterval: *probe,
			GossipSuspicionMult: *suspicion,
		}
	}
}
