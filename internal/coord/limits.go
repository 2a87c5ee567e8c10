package coord

import (
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/bucket"
	"github.com/allot-dev/allot/policy"
)

// Limit is a global limit's rate (tokens/s) and burst (tokens).
type Limit struct {
	Rate  float64
	Burst float64
}

// Limits maps a bucket key to its policy's global limit.
type Limits interface {
	// Global returns the global limit of key, or false when the key is not
	// a global-scope token-bucket limit (such keys are not rebalanced).
	Global(key string) (Limit, bool)
}

// Quota is a global fixed-window quota: Limit tokens per Window, counted
// by each region and exchanged (not shared: see docs/multi-region.md,
// "Global quotas").
type Quota struct {
	Limit  int64
	Window time.Duration
}

// Quotas maps a bucket key to its policy's global quota.
type Quotas interface {
	// Quota returns the global quota of key, or false when the key is not
	// a global-scope fixed-window limit.
	Quota(key string) (Quota, bool)
}

// PolicyLimits serves Limits and Quotas from a compiled policy set (the
// nodes' own, so algorithm names, burst defaults and rates are read as the
// nodes enforce them); Update swaps the set atomically (wire it to the
// policy store's watcher).
type PolicyLimits struct {
	byName  atomic.Pointer[map[string]Limit] // bucket.Name -> limit
	quotaBy atomic.Pointer[map[string]Quota]
}

// NewPolicyLimits returns Limits for set (nil: none).
func NewPolicyLimits(set *policy.Set) *PolicyLimits {
	l := &PolicyLimits{}
	l.Update(set)
	return l
}

// Update replaces the policies.
func (l *PolicyLimits) Update(set *policy.Set) {
	m, q := map[string]Limit{}, map[string]Quota{}
	if set != nil {
		set.Each(func(p *policy.Compiled) {
			if !p.Global {
				return
			}
			for _, lim := range p.Limits {
				s := lim.Spec
				if s.Period <= 0 || s.Limit <= 0 {
					continue
				}
				switch s.Algorithm {
				case algorithm.TokenBucket:
					m[bucket.Name(p.ID, lim.Name)] = Limit{Rate: s.Rate(), Burst: float64(s.Capacity())}
				case algorithm.FixedWindow:
					q[bucket.Name(p.ID, lim.Name)] = Quota{Limit: s.Limit, Window: s.Period}
				default:
					// Only token buckets read a share and only fixed windows
					// read remote counts; the other algorithms enforce L/n.
				}
			}
		})
	}
	l.byName.Store(&m)
	l.quotaBy.Store(&q)
}

// Global implements Limits.
func (l *PolicyLimits) Global(key string) (Limit, bool) {
	k, err := bucket.Parse(key)
	if err != nil {
		return Limit{}, false
	}
	lim, ok := (*l.byName.Load())[k.Name()]
	return lim, ok
}

// Quota implements Quotas.
func (l *PolicyLimits) Quota(key string) (Quota, bool) {
	k, err := bucket.Parse(key)
	if err != nil {
		return Quota{}, false
	}
	q, ok := (*l.quotaBy.Load())[k.Name()]
	return q, ok
}

// StaticLimits is a fixed Limits for tests and tools: a map from
// "<policy>:<limit>" (bucket.Name) to the limit.
type StaticLimits map[string]Limit

// Global implements Limits.
func (s StaticLimits) Global(key string) (Limit, bool) {
	k, err := bucket.Parse(key)
	if err != nil {
		return Limit{}, false
	}
	lim, ok := s[k.Name()]
	return lim, ok
}
