package sim

import (
	"context"
	"errors"
	"time"

	"github.com/allot-dev/allot/algorithm"
)

// A region's Redis down (Config.Outages): every call to it fails, and
// the nodes decide what they cannot take from leases on hand by the
// policy's on_store_failure, as package decide does (internal/decide/degraded.go):
// closed denies, open admits, local takes from the node's local fallback
// store (package fallback: the region's numbers over its live nodes).
// Admissions by open or local are outside the overshoot theorem's
// assumptions: they are counted apart (metrics.decided) and checked
// against the bound only in a second, reported check.

var errStoreDown = errors.New("sim: the region's Redis is down")

// down reports whether reg's Redis is unreachable now.
func (s *Sim) down(reg *region) bool { return s.downAt(reg, s.now) }

// downAt is down at virtual time at.
func (s *Sim) downAt(reg *region, at int64) bool {
	t := time.Duration(at)
	for _, o := range s.cfg.Outages {
		if o.Region == reg.idx && t >= o.From && t < o.To {
			return true
		}
	}
	return false
}

// storeFailed decides a request for key k whose take failed for want of
// the store.
func (nd *node) storeFailed(k int) {
	s := nd.s
	s.met.storeFailed++
	switch s.cfg.OnStoreFailure {
	case FailClosed:
		s.met.decided(nd.reg.idx, k, s.now, refused)
	case FailLocal:
		key := keyFn(string(s.subjects[k]))
		res, err := nd.fb.Take(context.Background(), []algorithm.Group{{{Key: key, Spec: s.nodeSpec, Cost: 1}}})
		if err != nil {
			// package decide fails open when the fallback cannot take.
			s.met.decided(nd.reg.idx, k, s.now, allowedOpen)
			return
		}
		v := refused
		if res[0].Allowed {
			v = allowedLocal
		}
		s.met.decided(nd.reg.idx, k, s.now, v)
	default:
		s.met.decided(nd.reg.idx, k, s.now, allowedOpen)
	}
}

// regionSize is the fallback's N: the region's live nodes.
type regionSize struct{ reg *region }

func (r regionSize) N() int { return len(r.reg.alive) }

// wall is the node's wall clock (its local fallback's): virtual time plus
// the node's offset.
func (nd *node) wall() time.Time { return epoch0.Add(time.Duration(nd.s.now + nd.clockOff)) }
