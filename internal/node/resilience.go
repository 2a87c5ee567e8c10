package node

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/allot-dev/allot/internal/fallback"
	"github.com/allot-dev/allot/internal/membership"
	"github.com/allot-dev/allot/region"
)

// Resilience configures how a node behaves when the region's Redis is
// slow or down (ARCHITECTURE.md ("Failure modes")): per-call deadlines, a circuit breaker
// per Redis shard, and the local fallback sized by region membership.
// The zero value takes every default.
type Resilience struct {
	// RedisTimeout is the time budget of one decision that asks Redis,
	// the decision without Redis after a timeout included. The exact-path
	// Redis call (dial and pool wait included) and a leased decision's
	// wait for a refill get RedisTimeout less RedisTimeoutMargin
	// (region.CallTimeout). cmd/node's --redis-timeout defaults to
	// region.DefaultTimeout (5 ms: a 4 ms Redis deadline); zero here means
	// region.DefaultReadTimeout (1 s), for nodes embedded in tests and
	// tools, which must not fail open on a loaded machine.
	RedisTimeout time.Duration
	// RedisTimeoutMargin is the part of RedisTimeout kept back from the
	// Redis call for waking up after its deadline and deciding by
	// on_store_failure. Zero means min(1 ms, RedisTimeout/5)
	// (region.DefaultTimeoutMargin); negative means none (the Redis call
	// gets all of RedisTimeout, as before the margin existed). It must be
	// less than RedisTimeout.
	RedisTimeoutMargin time.Duration
	// RedisMaxWait is region.Options.MaxWait: the longest a call waits on
	// a healthy shard before it is shed. It is also the deadline of an
	// asynchronous lease refill or return (lease.Options.CallTimeout),
	// which waits on the same shard. Zero takes region's default.
	RedisMaxWait time.Duration
	// Breaker configures the per-shard circuit breakers.
	Breaker region.BreakerOptions

	// GossipAddr is this node's memberlist listener (host:port, port 0
	// picks one). Empty disables gossip: N is then GossipFloor.
	GossipAddr string
	// GossipAdvertise is the address others reach this node on (default
	// GossipAddr's host).
	GossipAdvertise string
	// GossipSeeds are gossip addresses of other nodes of the region.
	GossipSeeds []string
	// GossipFloor is the least N the fallback divides limits by (default
	// membership.DefaultFloor): a node alone never takes the whole limit.
	GossipFloor int
	// GossipName is this node's unique name (default host:port-time).
	GossipName string
	// GossipProbeInterval and GossipSuspicionMult tune failure detection
	// (membership.Config); zero takes its defaults.
	GossipProbeInterval time.Duration
	GossipSuspicionMult int
}

func (r Resilience) redisTimeout() time.Duration {
	if r.RedisTimeout > 0 {
		return r.RedisTimeout
	}
	return region.DefaultReadTimeout
}

// callTimeout is the deadline of the Redis work of one decision: the
// budget less the margin.
func (r Resilience) callTimeout() (time.Duration, error) {
	call, err := region.CallTimeout(r.redisTimeout(), r.RedisTimeoutMargin)
	if err != nil {
		return 0, fmt.Errorf("redis timeout: %w", err)
	}
	return call, nil
}

func (r Resilience) regionOptions(n *Node, call time.Duration) region.Options {
	return region.Options{
		Timeout: call, Breaker: r.Breaker, Logger: n.log,
		MaxWait: r.RedisMaxWait,
	}
}

// StoreHealthService is the gRPC health service name that reports the
// region store: SERVING while every Redis shard's breaker is closed,
// NOT_SERVING while one is open or probing. The node's own service stays
// SERVING meanwhile, since it keeps answering by on_store_failure.
const StoreHealthService = "allot.store"

// resilience is the node's running part of Resilience.
type resilience struct {
	store    *region.Store       // nil standalone
	members  *membership.Members // nil without gossip
	fallback *fallback.Store
	stop     chan struct{}
	wg       sync.WaitGroup
}

// startResilience makes the local fallback for the decider, joining the
// region's gossip if configured. st is nil in standalone mode (no Redis,
// nothing to fall back from). It runs before the decider is made.
func (n *Node) startResilience(st *region.Store) error {
	r := &n.res
	r.store, r.stop = st, make(chan struct{})
	if st == nil {
		return nil
	}
	cfg := n.cfg.Resilience
	floor := cfg.GossipFloor
	if floor <= 0 {
		floor = membership.DefaultFloor
	}
	var size fallback.Sizer = fallback.Fixed(floor)
	if cfg.GossipAddr != "" {
		m, err := n.joinGossip(cfg)
		if err != nil {
			return err
		}
		r.members, size = m, m
	}
	r.fallback = fallback.New(size, nil)
	return nil
}

func (n *Node) joinGossip(cfg Resilience) (*membership.Members, error) {
	host, port, err := splitHostPort(cfg.GossipAddr)
	if err != nil {
		return nil, fmt.Errorf("gossip address %q: %w", cfg.GossipAddr, err)
	}
	m, err := membership.Join(membership.Config{
		Name: cfg.GossipName, BindAddr: host, BindPort: port, AdvertiseAddr: cfg.GossipAdvertise,
		Seeds: cfg.GossipSeeds, Floor: cfg.GossipFloor,
		ProbeInterval: cfg.GossipProbeInterval, SuspicionMult: cfg.GossipSuspicionMult,
		Logger: n.log,
	})
	if err != nil {
		return nil, err
	}
	n.closers = append(n.closers, func() error { return m.Leave(time.Second) })
	n.log.Info("gossip joined", "addr", m.Addr(), "seeds", cfg.GossipSeeds, "live", m.Live(), "n", m.N())
	return m, nil
}

func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", p)
	}
	return host, port, nil
}

// storeDegraded reports whether some shard's breaker is not closed: part
// of the region's keys are decided by on_store_failure.
func storeDegraded(s *region.Store) bool {
	for _, h := range s.Shards() {
		if h.State != region.BreakerClosed {
			return true
		}
	}
	return false
}

// watchStore keeps the StoreHealthService status in step with the
// breakers until the node closes.
func (n *Node) watchStore() {
	r := &n.res
	if r.store == nil {
		n.health.SetServingStatus(StoreHealthService, healthpb.HealthCheckResponse_SERVING)
		return
	}
	set := func() {
		st := healthpb.HealthCheckResponse_SERVING
		if storeDegraded(r.store) {
			st = healthpb.HealthCheckResponse_NOT_SERVING
		}
		n.health.SetServingStatus(StoreHealthService, st)
	}
	set()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-t.C:
				set()
			}
		}
	}()
	n.closers = append(n.closers, func() error {
		close(r.stop)
		r.wg.Wait()
		return nil
	})
}

// StoreStatus describes the store for /healthz and /readyz: "ok", or
// which shards' breakers are not closed and what N the fallback uses.
func (n *Node) StoreStatus() string {
	r := &n.res
	if r.store == nil {
		return "store: in-process"
	}
	var bad []string
	for _, h := range r.store.Shards() {
		if h.State != region.BreakerClosed {
			bad = append(bad, fmt.Sprintf("%s %s", h.Shard, h.State))
		}
	}
	var b strings.Builder
	if len(bad) == 0 {
		b.WriteString("store: ok")
	} else {
		b.WriteString("store: degraded, breaker not closed: " + strings.Join(bad, ", ") + "; deciding by on_store_failure")
	}
	fmt.Fprintf(&b, "; fallback n=%d", r.fallback.N())
	if r.members != nil {
		fmt.Fprintf(&b, " (live %d)", r.members.Live())
	}
	return b.String()
}

// Members is the node's region membership, or nil without gossip.
func (n *Node) Members() *membership.Members { return n.res.members }

// Store is the region store, or nil in standalone mode.
func (n *Node) Store() *region.Store { return n.res.store }
