package region_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
)

func settle1(t *testing.T, s *region.Store, it region.Settlement) region.Settled {
	t.Helper()
	res, err := s.Settle(context.Background(), []region.Settlement{it})
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.NoError(t, res[0].Err)
	require.Len(t, res[0].Parts, len(it.Consumers))
	return res[0]
}

// Two nodes settle one bucket: usage is charged after the fact (into
// debt, down to -burst), parts only grow into the room every node's held
// parts leave, and each node reads the other's demands.
func TestSettleChargesSplitsAndBounds(t *testing.T) {
	s := single(t)
	spec := tb(100, time.Hour, 0) // slow refill: numbers stay whole
	key := "rl:{tenant=a}:p:l"
	base := region.Settlement{Key: key, Spec: spec, TTL: 10 * time.Second, Horizon: time.Hour}
	a, b := base, base
	a.Node, b.Node = "a", "b"

	// a charges 30 and asks for the whole rate for one consumer.
	a.Usage = 30
	a.Consumers = []region.Consumer{{Offered: 5, Held: 0, Share: 1}}
	r := settle1(t, s, a)
	assert.Equal(t, int64(70), r.Tokens)
	assert.InDelta(t, 100.0/3600, r.Rate, 1e-12)
	assert.InDelta(t, 100.0/3600+70.0/3600, r.Avail, 1e-9, "avail = rate + tokens / horizon")
	assert.InDelta(t, r.Avail, r.Parts[0], 1e-9, "a grows only into the room: everything")
	assert.Empty(t, r.Others)

	// b wants the same: no room left while a holds its part.
	b.Consumers = []region.Consumer{{Offered: 7, Held: 0, Share: 1}}
	r = settle1(t, s, b)
	assert.InDelta(t, 0, r.Parts[0], 1e-6, "b cannot grow into a's held part (but what refilled since)")
	assert.Equal(t, []float64{5}, r.Others, "b reads a's demand")

	// a shrinks to half (recorded so at once: the node sends it right
	// away), and b grows into the rest.
	a.Usage = 0
	a.Consumers = []region.Consumer{{Offered: 5, Held: 0.03, Share: 0.5}}
	r = settle1(t, s, a)
	half := r.Avail / 2
	assert.InDelta(t, half, r.Parts[0], 1e-12, "a shrink is granted as asked: its share of avail")
	assert.Equal(t, []float64{7}, r.Others)
	b.Consumers = []region.Consumer{{Offered: 7, Held: 0, Share: 1}}
	r = settle1(t, s, b)
	assert.InDelta(t, r.Avail-half, r.Parts[0], 1e-9, "b grows into what a left")

	// Usage past the tokens runs into debt, at most burst + rate ·
	// horizon deep (100 + 100/h · 1 h); a bucket in debt grants no lease.
	b.Usage = 1000
	r = settle1(t, s, b)
	assert.Equal(t, int64(-200), r.Tokens)
	assert.Zero(t, r.Avail, "a bucket in debt has no rate to split over the horizon")
	l := lease1(t, s, lease.Group{{Key: key, Spec: spec, Need: 0, Want: 10}})
	assert.Zero(t, l.Items[0].Granted)

	// A node's record expires with its TTL.
	ttl, err := s.Client().PTTL(context.Background(), region.PartsKey(key)).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, time.Duration(0))
}

// A node charges its clients' use ahead of their reports (estimated) and
// refunds, as negative usage, what a report shows they did not admit.
func TestSettleRefundsUsageChargedAhead(t *testing.T) {
	s := single(t)
	it := region.Settlement{Key: "rl:{tenant=r}:p:l", Spec: tb(100, time.Hour, 0), Node: "a", TTL: 10 * time.Second, Horizon: time.Hour, Usage: 30}
	assert.Equal(t, int64(70), settle1(t, s, it).Tokens)
	it.Usage = -10
	assert.Equal(t, int64(80), settle1(t, s, it).Tokens, "refunded")
	it.Usage = -1000
	assert.Equal(t, int64(100), settle1(t, s, it).Tokens, "a refund fills the bucket no further than its burst (and a second's refill, not shown)")
}

// A node reads another's clients as spending since that node's last
// settlement at the rate it charges them, so that nodes whose
// settlements come at different phases split by the same tokens.
func TestSettleCountsOtherNodesSpendSinceTheirSettlement(t *testing.T) {
	s := single(t)
	base := region.Settlement{Key: "rl:{tenant=s}:p:l", Spec: tb(100, time.Hour, 0), TTL: 10 * time.Second, Horizon: time.Second}
	a, b := base, base
	a.Node, b.Node = "a", "b"
	a.Consumers = []region.Consumer{{Offered: 1e6, Held: 1e5, Share: -1}}
	r := settle1(t, s, a)
	assert.InDelta(t, 100, r.Avail, 1, "a: the burst over a 1 s horizon")
	time.Sleep(20 * time.Millisecond) // Redis TIME moves on: a's clients spend 2,000 tokens meanwhile
	b.Consumers = []region.Consumer{{Offered: 5, Held: 0, Share: 1}}
	r = settle1(t, s, b)
	assert.Zero(t, r.Avail, "b counts what a's clients spent since a settled: the bucket is empty")
}

// A consumer's part is its share of avail as the script finds it, and
// within the hysteresis of what it holds it keeps that (the node sends
// its strategy again unchanged).
func TestSettleAppliesSharesWithHysteresis(t *testing.T) {
	s := single(t)
	it := region.Settlement{Key: "rl:{tenant=h}:p:l", Spec: tb(100, time.Hour, 0), Node: "a", TTL: 10 * time.Second, Horizon: time.Second, Hysteresis: 0.05}
	it.Consumers = []region.Consumer{{Offered: 1e3, Held: 50, Share: 0.5}}
	r := settle1(t, s, it)
	assert.InDelta(t, 100, r.Avail, 1)
	assert.Equal(t, 50.0, r.Parts[0], "half of avail is within 5 %% of 50: kept")
	it.Consumers = []region.Consumer{{Offered: 1e3, Held: 40, Share: 0.5}}
	r = settle1(t, s, it)
	assert.InDelta(t, r.Avail/2, r.Parts[0], 1e-9, "past the hysteresis: the share of avail")
}

func TestSettleRefusesBadArguments(t *testing.T) {
	s := single(t)
	ok := region.Settlement{Key: "rl:{t}:p:l", Spec: tb(10, time.Second, 0), Node: "n", TTL: time.Second, Horizon: time.Second}
	for name, mod := range map[string]func(*region.Settlement){
		"no node": func(it *region.Settlement) { it.Node = "" },
		"no TTL":  func(it *region.Settlement) { it.TTL = 0 },
	} {
		it := ok
		mod(&it)
		_, err := s.Settle(context.Background(), []region.Settlement{it})
		assert.Error(t, err, name)
	}
	it := ok
	it.Node = "a|b" // the record's separator
	res, err := s.Settle(context.Background(), []region.Settlement{it})
	require.NoError(t, err)
	assert.ErrorContains(t, res[0].Err, "allot:")
}

// A lease answer says whether RLQS parts hold the bucket: the clients'
// use is charged after the fact, so a node must not take the bucket as
// its own alone (lease.Alone). The flag lasts as long as the parts' TTL.
func TestLeaseSaysWhilePartsHoldTheBucket(t *testing.T) {
	s := single(t)
	spec := tb(100, time.Second, 0)
	key := "rl:{tenant=shared}:p:l"
	g := lease.Group{{Key: key, Spec: spec, Need: 0, Want: 1}}
	assert.False(t, lease1(t, s, g).Items[0].Shared, "no parts yet")

	it := region.Settlement{Key: key, Spec: spec, Node: "a", TTL: 300 * time.Millisecond, Horizon: time.Second,
		Consumers: []region.Consumer{{Offered: 5, Held: 0, Share: 1}}}
	settle1(t, s, it)
	assert.True(t, lease1(t, s, g).Items[0].Shared, "a node's clients hold parts")

	// A settlement with no consumers writes no parts; the old ones end
	// with their TTL.
	it.Consumers = nil
	_, err := s.Settle(context.Background(), []region.Settlement{it})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return !lease1(t, s, g).Items[0].Shared }, 5*time.Second, 20*time.Millisecond, "the parts' TTL ended")
}
