package region

import (
	"sort"
	"time"
)

// ShardHealth is one shard's breaker as seen by this node.
type ShardHealth struct {
	Shard    string // master address ("host:port")
	State    BreakerState
	Failed   int    // round trips failed in a row
	Openings uint64 // times the breaker opened since the store started
	// ProbeFailures counts the failed probes since the store started.
	ProbeFailures uint64
}

// Shards reports each shard's breaker (none when disabled): the single
// server's, or every cluster master's. An address that masters no slot
// (a dead master whose replica was promoted) serves no key and is left
// out, then forgotten once unused for MaxOpen.
func (s *Store) Shards() []ShardHealth {
	if s.opts.Breaker.Disabled {
		return nil
	}
	masters := s.masters()
	horizon := time.Now().Add(-s.opts.Breaker.MaxOpen)
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

// health reports the shard's breaker.
func (sh *shard) health() ShardHealth {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	h := ShardHealth{Shard: sh.addr}
	if sh.brk != nil {
		h.State, h.Failed = sh.brk.state, sh.brk.failed
		h.Openings, h.ProbeFailures = sh.brk.openings, sh.brk.probeFailures
	}
	return h
}
