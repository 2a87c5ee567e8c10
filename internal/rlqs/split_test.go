package rlqs

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/region"
)

// usageLedger records the usage each settlement charges.
type usageLedger struct{ charged []int64 }

func (l *usageLedger) Settle(_ context.Context, items []region.Settlement) ([]region.Settled, error) {
	out := make([]region.Settled, len(items))
	for i, it := range items {
		l.charged = append(l.charged, it.Usage)
		out[i] = region.Settled{Avail: 1000, Rate: 1000, Parts: make([]float64, len(it.Consumers))}
	}
	return out, nil
}

// Between a client's reports, each settlement charges what it is taken
// to admit (its part, or its offered rate if smaller); its report charges the
// difference to what it did admit, a refund if negative.
func TestSettlementsChargeAheadOfReports(t *testing.T) {
	l := &usageLedger{}
	s := newSplitter("n", l)
	k := decide.QuotaKey{Key: "k", Spec: algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: 1000, Period: time.Second}}
	c := &consumer{seq: 1}
	t0 := time.Unix(1000, 0)
	ctx := context.Background()

	s.join(k, c, 5000, time.Second) // reports every second: settled every second
	s.use("k", c, 1, t0)            // the first report: one request
	s.settle(ctx, t0, []string{"k"}, []*consumer{c})
	s.claim(map[string]*consumer{"k": c}, 100, t0.Add(7*time.Second))
	s.settle(ctx, t0.Add(time.Second), []string{"k"}, nil)
	s.settle(ctx, t0.Add(2*time.Second), []string{"k"}, nil)
	s.use("k", c, 180, t0.Add(2500*time.Millisecond)) // admitted 180, 200 charged
	s.settle(ctx, t0.Add(3*time.Second), []string{"k"}, nil)
	require.Len(t, l.charged, 4)
	assert.Equal(t, []int64{1, 100, 100, -20 + 50}, l.charged)

	// An offered rate below the part is what it is taken to admit.
	s.join(k, c, 40, time.Second)
	s.settle(ctx, t0.Add(4*time.Second), []string{"k"}, nil)
	assert.Equal(t, int64(40), l.charged[4])
}
