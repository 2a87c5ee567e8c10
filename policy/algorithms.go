package policy

import (
	"strings"
	"time"

	"github.com/allot-dev/allot/algorithm"
)

// limitFits checks what a limit's algorithm requires of it, once its own
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
		v.add(id, at, "%v cannot be leased (precision: leased): only %s can be (a node spends leased tokens in advance, which only a bucket lease.lua can draw down and refill allows); use %s, or precision: exact", a, leasable(), leasable())
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

// leasable names the algorithms algorithm.Leasable allows, so the advice
// cannot drift from what leasing accepts (it once suggested gcra).
func leasable() string {
	var names []string
	for a := algorithm.TokenBucket; a <= algorithm.FixedWindow; a++ {
		if a.Leasable() {
			names = append(names, a.String())
		}
	}
	return strings.Join(names, " or ")
}
