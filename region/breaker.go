package region

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
)

// ErrUnavailable is returned (wrapped) for calls to a shard whose circuit
// breaker is open, or half-open with its probe already in flight: the call
// was not sent, so it cannot have run. Callers decide by on_store_failure.
var ErrUnavailable = errors.New("region: redis shard unavailable (circuit breaker open)")

// Breaker defaults: the design's numbers (seed 002, 7.6).
const (
	DefaultBreakerWindow       = 10 * time.Second
	DefaultBreakerBucket       = time.Second
	DefaultBreakerFailureRatio = 0.5
	DefaultBreakerMinRequests  = 20
	DefaultBreakerOpenFor      = 5 * time.Second
	// DefaultBreakerConsecutive opens a breaker after this many failed
	// calls in a row, whatever the window holds. Without it a shard that
	// dies under steady traffic opens only when failures reach half of a
	// window full of earlier successes, about Window/2 later, and every
	// call meanwhile waits for its deadline.
	DefaultBreakerConsecutive = 10
)

// BreakerOptions configure the circuit breaker of each Redis shard. A
// breaker opens when, over the rolling Window, at least MinRequests calls
// were made and at least FailureRatio of them failed, or when Consecutive
// calls in a row failed; while open, calls
// fail at once with ErrUnavailable. After OpenFor it lets one probe call
// through (half-open): success closes it, failure opens it again.
type BreakerOptions struct {
	// Window is the rolling window errors are counted over, in steps of
	// Bucket (a bucket's counts leave the window whole).
	Window time.Duration
	Bucket time.Duration
	// FailureRatio in (0, 1] of failed calls opens the breaker.
	FailureRatio float64
	// MinRequests is the least number of calls in the window before the
	// ratio counts, so that one failed call on an idle node does not open.
	MinRequests uint32
	// OpenFor is how long the breaker stays open before it probes.
	OpenFor time.Duration
	// Consecutive failed calls in a row also open the breaker (a dead or
	// frozen shard); zero means DefaultBreakerConsecutive, negative
	// disables the rule.
	Consecutive int
	// Disabled turns breakers off (every call goes to Redis, bounded by its
	// deadline). For benchmarks that compare.
	Disabled bool
}

func (o BreakerOptions) withDefaults() BreakerOptions {
	if o.Window <= 0 {
		o.Window = DefaultBreakerWindow
	}
	if o.Bucket <= 0 || o.Bucket > o.Window {
		o.Bucket = min(DefaultBreakerBucket, o.Window)
	}
	if o.FailureRatio <= 0 || o.FailureRatio > 1 {
		o.FailureRatio = DefaultBreakerFailureRatio
	}
	if o.MinRequests == 0 {
		o.MinRequests = DefaultBreakerMinRequests
	}
	if o.OpenFor <= 0 {
		o.OpenFor = DefaultBreakerOpenFor
	}
	if o.Consecutive == 0 {
		o.Consecutive = DefaultBreakerConsecutive
	}
	return o
}

// BreakerState is a breaker's state, as health reports it.
type BreakerState = gobreaker.State

// Breaker states.
const (
	BreakerClosed   = gobreaker.StateClosed
	BreakerHalfOpen = gobreaker.StateHalfOpen
	BreakerOpen     = gobreaker.StateOpen
)

// ShardHealth is one shard's breaker as seen by this node.
type ShardHealth struct {
	Shard    string // master address ("host:port")
	State    BreakerState
	Requests uint32 // calls counted in the current window
	Failures uint32 // of which failed
}

// shardBreaker is one shard's breaker and when it was last consulted.
type shardBreaker struct {
	cb      *gobreaker.TwoStepCircuitBreaker[struct{}]
	lastUse atomic.Int64 // unix nanoseconds
}

// breakers holds one breaker per Redis master, created on first use.
type breakers struct {
	opts BreakerOptions
	log  *slog.Logger
	mu   sync.RWMutex
	m    map[string]*shardBreaker
}

func newBreakers(opts BreakerOptions, log *slog.Logger) *breakers {
	return &breakers{opts: opts.withDefaults(), log: log, m: map[string]*shardBreaker{}}
}

// get returns the breaker of shard, creating it on first use.
func (b *breakers) get(shard string) *shardBreaker {
	b.mu.RLock()
	sb := b.m[shard]
	b.mu.RUnlock()
	if sb == nil {
		b.mu.Lock()
		if sb = b.m[shard]; sb == nil {
			sb = &shardBreaker{cb: gobreaker.NewTwoStepCircuitBreaker[struct{}](b.settings(shard))}
			b.m[shard] = sb
		}
		b.mu.Unlock()
	}
	sb.lastUse.Store(time.Now().UnixNano())
	return sb
}

func (b *breakers) settings(shard string) gobreaker.Settings {
	o := b.opts
	return gobreaker.Settings{
		Name:         shard,
		MaxRequests:  1, // one probe when half-open; its success closes
		Interval:     o.Window,
		BucketPeriod: o.Bucket,
		Timeout:      o.OpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			if o.Consecutive > 0 && c.ConsecutiveFailures >= uint32(o.Consecutive) {
				return true
			}
			return c.Requests >= o.MinRequests && float64(c.TotalFailures) >= o.FailureRatio*float64(c.Requests)
		},
		IsSuccessful: func(err error) bool { return !shardFailure(err) },
		// A caller that gave up (cancelled) says nothing about the shard.
		IsExcluded: func(err error) bool { return errors.Is(err, context.Canceled) },
		OnStateChange: func(name string, from, to gobreaker.State) {
			lvl := slog.LevelWarn
			if to == gobreaker.StateClosed {
				lvl = slog.LevelInfo
			}
			b.log.Log(context.Background(), lvl, "redis circuit breaker", "shard", name, "from", from.String(), "to", to.String())
		},
	}
}

// health lists the breakers consulted within the last window plus open
// period; older ones (a master that failed over away) are forgotten.
func (b *breakers) health() []ShardHealth {
	horizon := time.Now().Add(-(b.opts.Window + b.opts.OpenFor)).UnixNano()
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]ShardHealth, 0, len(b.m))
	for shard, sb := range b.m {
		if sb.lastUse.Load() < horizon {
			delete(b.m, shard)
			continue
		}
		c := sb.cb.Counts()
		out = append(out, ShardHealth{Shard: shard, State: sb.cb.State(), Requests: c.Requests, Failures: c.TotalFailures})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Shard < out[j].Shard })
	return out
}

// shardFailure reports whether err says the shard is unhealthy: it did not
// answer in time, the connection failed, or it answered that it cannot
// serve (loading, failing over, read-only replica, cluster down). A
// script's own error or a reply the caller cannot parse is the shard
// working, not failing.
func shardFailure(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, redis.ErrClosed), errors.Is(err, redis.ErrPoolTimeout), errors.As(err, &ne):
		return true
	}
	for _, p := range []string{"LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "BUSY"} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	var re redis.Error
	// Any other reply from Redis is an answer; anything else (a dial
	// error that is not a net.Error, a broken reply) is a failure.
	return !errors.As(err, &re)
}

// unknownShard keys the breaker of calls whose master could not be found
// (no cluster state): if the cluster stays unreachable, that breaker opens
// too, instead of every call waiting for its deadline.
const unknownShard = "cluster (unknown master)"

// shardOf names the master serving key: the one address of a single
// server, or for a cluster the master of key's slot, from the client's
// cached slot map (refreshed by go-redis on MOVED and periodically).
func (s *Store) shardOf(ctx context.Context, key string) string {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return s.addr
	}
	c, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return unknownShard
	}
	return c.Options().Addr
}

// Shards reports each shard's breaker (those used recently). Empty when
// breakers are disabled or nothing was called yet. In a cluster, a
// breaker of an address that no longer masters any slot (a master that
// died and whose replica was promoted) is left out: it serves no key, and
// its open breaker would otherwise report the region degraded until it is
// forgotten (window + open-for after its last probe).
func (s *Store) Shards() []ShardHealth {
	if s.breakers == nil {
		return nil
	}
	all := s.breakers.health()
	masters := s.masters()
	if masters == nil {
		return all
	}
	out := all[:0]
	for _, h := range all {
		if h.Shard == unknownShard || masters[h.Shard] {
			out = append(out, h)
		}
	}
	return out
}

// masters is the set of master addresses in a cluster client's slot map,
// or nil for a single server or when the map cannot be read.
func (s *Store) masters() map[string]bool {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	var mu sync.Mutex
	m := map[string]bool{}
	// ForEachMaster reads the cached slot map; the callback does no I/O.
	err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		m[c.Options().Addr] = true
		mu.Unlock()
		return nil
	})
	if err != nil || len(m) == 0 {
		return nil
	}
	return m
}

// Degraded reports whether some shard's breaker is not closed: part of the
// region's keys are decided without Redis.
func (s *Store) Degraded() bool {
	for _, h := range s.Shards() {
		if h.State != BreakerClosed {
			return true
		}
	}
	return false
}

// admission is guard's verdict on the calls of one pipeline.
type admission struct {
	// via[i] is 1 + the index in shards of call i's shard, or 0 when the
	// call is not sent (no keys, or its shard's breaker refused it).
	via    []int
	shards []admittedShard
}

// admittedShard is one shard asked once per pipeline: done reports the
// outcome to its breaker; nil when the breaker refused (err says why) or
// when breakers are disabled.
type admittedShard struct {
	addr string
	done func(error)
	err  error
}

func (a admission) sent(i int) bool { return a.via[i] > 0 }

// guard admits the calls of one pipeline shard by shard. For each call i
// with keys, it finds the shard and asks its breaker once per shard; calls
// to a shard that refuses get an error command (ErrUnavailable) and are
// not sent. A pipeline touches a handful of shards, so they are found by
// a linear scan rather than a map: this runs once per decision.
func (s *Store) guard(ctx context.Context, keys [][]string, cmds []*redis.Cmd) admission {
	a := admission{via: make([]int, len(keys))}
	if s.breakers == nil {
		a.shards = []admittedShard{{}}
		for i := range keys {
			if keys[i] != nil {
				a.via[i] = 1
			}
		}
		return a
	}
	for i, k := range keys {
		if k == nil {
			continue
		}
		addr := s.shardOf(ctx, k[0])
		si := slices.IndexFunc(a.shards, func(sh admittedShard) bool { return sh.addr == addr })
		if si < 0 {
			sh := admittedShard{addr: addr}
			done, berr := s.breakers.get(addr).cb.Allow()
			if berr == nil {
				sh.done = done
			} else {
				sh.err = fmt.Errorf("%w: %s: %w", ErrUnavailable, addr, berr)
			}
			a.shards = append(a.shards, sh)
			si = len(a.shards) - 1
		}
		if err := a.shards[si].err; err != nil {
			c := redis.NewCmd(ctx)
			c.SetErr(err)
			cmds[i] = c
			continue
		}
		a.via[i] = si + 1
	}
	return a
}

// report tells each admitting breaker the outcome of its shard's calls.
// The worst outcome speaks for the shard: a failure, else a cancellation
// (excluded from the counts), else success.
func (a admission) report(cmds []*redis.Cmd) {
	for si, sh := range a.shards {
		if sh.done == nil {
			continue
		}
		var outcome error
		for i, v := range a.via {
			if v != si+1 {
				continue
			}
			err := cmds[i].Err()
			if shardFailure(err) {
				outcome = err
				break
			}
			if errors.Is(err, context.Canceled) {
				outcome = err
			}
		}
		sh.done(outcome)
	}
}
