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

// PolicyLimits serves Limits from a policy file; Update swaps the file
// atomically (wire it to the policy store's watcher).
type PolicyLimits struct {
	byName atomic.Pointer[map[string]Limit] // "<policy>:<limit>" -> limit
}

// NewPolicyLimits returns Limits for f (nil: none).
func NewPolicyLimits(f *policy.File) *PolicyLimits {
	l := &PolicyLimits{}
	l.Update(f)
	return l
}

// Update replaces the policies.
func (l *PolicyLimits) Update(f *policy.File) {
	m := map[string]Limit{}
	if f != nil {
		for _, p := range f.Policies {
			if p.Scope != policy.ScopeGlobal {
				continue
			}
			for _, lim := range p.Limits {
				if lim.Algorithm != "" && lim.Algorithm != "token_bucket" && lim.Algorithm != "gcra" {
					continue // windows are counted, not shared (see docs/multi-region.md)
				}
				period := time.Duration(lim.Period).Seconds()
				if period <= 0 || lim.Limit <= 0 {
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
}

// Global implements Limits. Keys are rl:{<subject>}:<policy>:<limit>; the
// subject is escaped, so the last "}:" ends it, and policy ids and limit
// names contain no ':'.
func (l *PolicyLimits) Global(key string) (Limit, bool) {
	i := strings.LastIndex(key, "}:")
	if !strings.HasPrefix(key, "rl:{") || i < 0 {
		return Limit{}, false
	}
	lim, ok := (*l.byName.Load())[key[i+2:]]
	return lim, ok
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
