package policy

import (
	"time"

	"github.com/allot-dev/allot/algorithm"
)

// limitFits checks what a limit's algorithm demands of it, once its own
// fields are in range (limit checks those): the algorithm's bounds
// (algorithm.Spec.Validate: the log's memory cap, burst only for buckets,
// whole milliseconds) and that a leased policy uses only algorithms that
// can be leased.
func (v *validator) limitFits(id string, j int, l *Limit, leased bool) {
	a, err := algorithm.Parse(l.Algorithm)
	if err != nil {
		return // reported by limit
	}
	at := "limits[" + itoa(j) + "].algorithm"
	if leased && !a.Leasable() {
		v.add(id, at, "%v cannot be leased (precision: leased): a node cannot spend a window's or a log's quota in advance; use token_bucket or gcra, or precision: exact", a)
	}
	period := time.Duration(l.Period)
	if l.Limit < 1 || l.Limit > MaxLimit || period < MinPeriod || period > MaxPeriod || l.Burst < 0 || l.Burst > MaxLimit {
		return // reported by limit
	}
	s := algorithm.Spec{Algorithm: a, Limit: l.Limit, Period: period, Burst: l.Burst}
	if err := s.Validate(); err != nil {
		v.add(id, at, "%v", err)
	}
}

func itoa(j int) string {
	const digits = "0123456789"
	if j < 10 {
		return digits[j : j+1]
	}
	return itoa(j/10) + digits[j%10:j%10+1]
}
