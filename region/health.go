package region

import (
	"context"
	"errors"
	"io"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ShardHealth is one shard's breaker as seen by this node.
type ShardHealth struct {
	Shard    string // master address ("host:port")
	State    BreakerState
	Requests uint32 // round trips counted in the current window
	Failures uint32 // of which failed
	Openings uint64 // times the breaker opened since the store started
	// ProbeFailures counts the background probes of the open breaker that
	// failed since the store started.
	ProbeFailures uint64
}

// shardFailure reports whether err says the shard is unhealthy: it did not
// answer in time, the connection failed, or it answered that it cannot
// serve (loading, failing over, read-only replica, cluster down). A
// script's own error or a reply the caller cannot parse is the shard
// working, not failing. A shed call says nothing about the shard.
func shardFailure(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, ErrOverloaded) {
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

// unknownShard names the shard of calls whose master could not be found
// (no cluster state): if the cluster stays unreachable, its breaker opens
// too, instead of every call waiting.
const unknownShard = "cluster (unknown master)"

// shardOf returns the shard serving key: the single server, or for a
// cluster the master of key's slot, from the client's cached slot map
// (refreshed by go-redis on MOVED and periodically, and by reloadState).
func (s *Store) shardOf(ctx context.Context, key string) *shard {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return s.shard(s.addr, nil)
	}
	c, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return s.shard(unknownShard, nil)
	}
	return s.shard(c.Options().Addr, c)
}

// shard returns the shard of addr, creating it on first use. client is
// the master's own client (cluster), used for probes.
func (s *Store) shard(addr string, client *redis.Client) *shard {
	s.mu.RLock()
	sh := s.shards[addr]
	s.mu.RUnlock()
	if sh == nil {
		s.mu.Lock()
		if sh = s.shards[addr]; sh == nil {
			sh = &shard{s: s, addr: addr, prog: s.conns.of(addr), client: client, work: make(chan *pipe)}
			if !s.opts.Breaker.Disabled {
				sh.brk = newBreaker(s.opts.Breaker)
			}
			s.shards[addr] = sh
		}
		s.mu.Unlock()
	}
	if client != nil && sh.client != client {
		sh.mu.Lock()
		sh.client = client
		sh.mu.Unlock()
	}
	return sh
}

// Shards reports each shard's breaker, for health and metrics: the single
// server's always, and in a cluster every master's. A breaker of an
// address that no longer masters any slot (a master that died and whose
// replica was promoted) is left out: it serves no key, and its open
// breaker would otherwise report the region degraded; it is forgotten
// once unused for a window plus an open period. Empty when breakers are
// disabled.
func (s *Store) Shards() []ShardHealth {
	if s.opts.Breaker.Disabled {
		return nil
	}
	masters := s.masters()
	horizon := time.Now().Add(-(s.opts.Breaker.Window + s.opts.Breaker.OpenFor))
	s.mu.Lock()
	all := make([]*shard, 0, len(s.shards))
	for addr, sh := range s.shards {
		if masters != nil && addr != unknownShard && !masters[addr] {
			sh.mu.Lock()
			old := sh.lastUse.Before(horizon) && len(sh.inflight) == 0 && len(sh.queue) == 0
			sh.mu.Unlock()
			if old {
				sh.stop()
				delete(s.shards, addr)
			}
			continue
		}
		all = append(all, sh)
	}
	s.mu.Unlock()
	out := make([]ShardHealth, 0, len(all))
	for _, sh := range all {
		out = append(out, sh.health())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Shard < out[j].Shard })
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

// StoreStats are counts since the store opened.
type StoreStats struct {
	Pipelines int64 // round trips sent
	Calls     int64 // store calls sent in them, one per group (a round trip's token-bucket checks share one EVALSHA)
	Stalls    int64 // times a shard was judged stalled
	Shed      int64 // calls shed (queue full, or not sent within MaxWait)
}

// Stats reports the store's counters.
func (s *Store) Stats() StoreStats {
	return StoreStats{
		Pipelines: s.stats.pipelines.Load(),
		Calls:     s.stats.calls.Load(),
		Stalls:    s.stats.stalls.Load(),
		Shed:      s.stats.shed.Load(),
	}
}
