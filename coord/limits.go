package coord

import (
	"strings"
	"sync/atomic"
	"time"

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

// PolicyLimits serves Limits and Quotas from a policy file; Update swaps
// the file atomically (wire it to the policy store's watcher).
type PolicyLimits struct {
	byName  atomic.Pointer[map[string]Limit] // "<policy>:<limit>" -> limit
	quotaBy atomic.Pointer[map[string]Quota]
}

// NewPolicyLimits returns Limits for f (nil: none).
func NewPolicyLimits(f *policy.File) *PolicyLimits {
	l := &PolicyLimits{}
	l.Update(f)
	return l
}

// Update replaces the policies.
func (l *PolicyLimits) Update(f *policy.File) {
	m, q := map[string]Limit{}, map[string]Quota{}
	if f != nil {
		for _, p := range f.Policies {
			if p.Scope != policy.ScopeGlobal {
				continue
			}
			for _, lim := range p.Limits {
				period := time.Duration(lim.Period).Seconds()
				if period <= 0 || lim.Limit <= 0 {
					continue
				}
				switch lim.Algorithm {
				case "", "token_bucket":
				case "fixed_window":
					q[p.ID+":"+lim.Name] = Quota{Limit: lim.Limit, Window: time.Duration(lim.Period)}
					continue
				default:
					// Only token buckets read a share and only fixed windows
					// read remote counts; the other algorithms enforce L/n.
					continue
				}
				burst := lim.Burst
				if burst == 0 {
					burst = lim.Limit
				}
				m[p.ID+":"+lim.Name] = Limit{Rate: float64(lim.Limit) / period, Burst: float64(burst)}
			}
		}
	}
	l.byName.Store(&m)
	l.quotaBy.Store(&q)
}

// Global implements Limits. Keys are rl:{<subject>}:<policy>:<limit>; the
// subject is escaped, so the last "}:" ends it, and policy ids and limit
// names contain no ':'.
func (l *PolicyLimits) Global(key string) (Limit, bool) {
	name, ok := limitName(key)
	if !ok {
		return Limit{}, false
	}
	lim, ok := (*l.byName.Load())[name]
	return lim, ok
}

// Quota implements Quotas.
func (l *PolicyLimits) Quota(key string) (Quota, bool) {
	name, ok := limitName(key)
	if !ok {
		return Quota{}, false
	}
	q, ok := (*l.quotaBy.Load())[name]
	return q, ok
}

// limitName returns the "<policy>:<limit>" of a bucket key
// rl:{<subject>}:<policy>:<limit>.
func limitName(key string) (string, bool) {
	i := strings.LastIndex(key, "}:")
	if !strings.HasPrefix(key, "rl:{") || i < 0 {
		return "", false
	}
	return key[i+2:], true
}

// StaticLimits is a fixed Limits for tests and tools: a map from
// "<policy>:<limit>" to the limit.
type StaticLimits map[string]Limit

// Global implements Limits.
func (s StaticLimits) Global(key string) (Limit, bool) {
	i := strings.LastIndex(key, "}:")
	if i < 0 {
		return Limit{}, false
	}
	lim, ok := s[key[i+2:]]
	return lim, ok
}
