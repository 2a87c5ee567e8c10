package main

import (
	"flag"
	"time"

	"github.com/allot-dev/allot/membership"
	"github.com/allot-dev/allot/node"
	"github.com/allot-dev/allot/region"
)

// resilienceFlags declares the flags of node.Resilience (Redis deadlines,
// circuit breakers, local fallback sizing, gossip) and returns a function
// that reads them after parsing.
func resilienceFlags(fs *flag.FlagSet) func() node.Resilience {
	timeout := fs.Duration("redis-timeout", region.DefaultTimeout, "time budget of one decision that asks Redis, the decision by the policy's on_store_failure after a Redis timeout included: the exact-path Redis call (dial and pool wait included) and a leased decision's wait for a refill get this less --redis-timeout-margin")
	margin := fs.Duration("redis-timeout-margin", 0, "part of --redis-timeout kept back from the Redis call, for waking up after its deadline and deciding without Redis; 0 means min(1ms, --redis-timeout/5), negative none; must be less than --redis-timeout")
	leaseTimeout := fs.Duration("redis-lease-timeout", region.DefaultLeaseTimeout, "deadline of one asynchronous lease refill or return (no decision waits for it beyond --redis-timeout)")
	window := fs.Duration("breaker-window", region.DefaultBreakerWindow, "circuit breaker: rolling window over which a Redis shard's errors are counted")
	bucket := fs.Duration("breaker-bucket", region.DefaultBreakerBucket, "circuit breaker: the window rolls in steps of this")
	ratio := fs.Float64("breaker-failure-ratio", region.DefaultBreakerFailureRatio, "circuit breaker: fraction of failed calls in the window that opens a shard's breaker")
	minReq := fs.Uint("breaker-min-requests", region.DefaultBreakerMinRequests, "circuit breaker: least calls in the window before the ratio counts")
	consecutive := fs.Int("breaker-consecutive-failures", region.DefaultBreakerConsecutive, "circuit breaker: this many failed calls in a row also open a shard's breaker (a dead shard under steady traffic would otherwise wait for half a window); negative disables")
	openFor := fs.Duration("breaker-open-for", region.DefaultBreakerOpenFor, "circuit breaker: how long an open breaker fails calls at once before one probe call (half-open)")
	gossip := fs.String("gossip-addr", "", "memberlist gossip listen address HOST:PORT (TCP and UDP); empty disables gossip and the local fallback divides limits by --gossip-floor")
	advertise := fs.String("gossip-advertise", "", "gossip address other nodes reach this one on (default: --gossip-addr's host)")
	seeds := fs.String("gossip-seeds", "", "comma-separated gossip addresses of other nodes of the region")
	floor := fs.Int("gossip-floor", membership.DefaultFloor, "least N the local fallback divides limits by, whatever gossip sees (a node alone never takes the whole limit)")
	name := fs.String("gossip-name", "", "unique node name in the region (default: address and start time)")
	probe := fs.Duration("gossip-probe-interval", 500*time.Millisecond, "gossip: how often a node probes another; failure detection takes a few of these")
	suspicion := fs.Int("gossip-suspicion-mult", 4, "gossip: a suspect node is declared dead after about this many probe intervals (times log10 N)")
	return func() node.Resilience {
		return node.Resilience{
			RedisTimeout:       *timeout,
			RedisTimeoutMargin: *margin,
			LeaseTimeout:       *leaseTimeout,
			Breaker: region.BreakerOptions{
				Window: *window, Bucket: *bucket, FailureRatio: *ratio,
				MinRequests: uint32(min(*minReq, 1<<31)), OpenFor: *openFor, Consecutive: *consecutive,
			},
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
