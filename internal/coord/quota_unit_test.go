package coord

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/bucket"
	coordv1 "github.com/allot-dev/allot/proto/coord/v1"
)

const quotaUnitKey = "rl:{tenant=solo}:hourly:quota"

// staticQuotas is a fixed Quotas: bucket.Name -> quota.
type staticQuotas map[string]Quota

func (s staticQuotas) Quota(key string) (Quota, bool) {
	k, err := bucket.Parse(key)
	if err != nil {
		return Quota{}, false
	}
	q, ok := s[k.Name()]
	return q, ok
}

// The quota exchange of docs/multi-region.md ("Global quotas") in virtual
// time: counts travel whole once they reach QuotaThreshold·L/n, every
// region stores the sum of the others' newest window, only ever raised,
// and a newer window replaces an older one; a region unheard keeps
// counting with its last count.
func TestQuotaCountsAreExchangedInVirtualTime(t *testing.T) {
	n := newVnet(t, "ap", "eu", "us")
	n.quotas = staticQuotas{"hourly:quota": {Limit: 3000, Window: time.Hour}}
	for _, r := range n.regions {
		n.add(r, r, testKnobs(), 0, testLogger(t))
	}
	win := n.now.UnixNano() / int64(time.Hour)
	count := func(region string, w int64, used uint64) {
		if n.counts[region] == nil {
			n.counts[region] = map[string]QuotaCount{}
		}
		n.counts[region][quotaUnitKey] = QuotaCount{Window: w, Used: used}
	}
	remote := func(region string) QuotaCount { return n.remote[region][quotaUnitKey] }
	// Nodes report demand of the key: the coordinators read its counts.
	n.setDemand(quotaUnitKey, 1, 1, 1)

	count("eu", win, 300)
	count("ap", win, 0)
	count("us", win, 5) // under QuotaThreshold·L/n = 1% of 1000: does not travel
	n.run(5 * testKnobs().Interval)
	require.Equal(t, QuotaCount{Window: win, Used: 300}, remote("ap"), "ap learnt eu's count, not us's 5")
	require.Equal(t, QuotaCount{Window: win, Used: 300}, remote("us"))
	require.Zero(t, remote("eu").Used, "ap counted nothing and us too little to travel")

	// us is cut off and counts 50 meanwhile: eu and ap keep its last
	// count; after healing they add it.
	n.deliver = func(from, to *member, _ *coordv1.Message) []time.Duration {
		if from.region == "us" || to.region == "us" {
			return nil
		}
		return []time.Duration{time.Millisecond}
	}
	count("us", win, 50)
	n.run(3 * testKnobs().Interval)
	require.Zero(t, remote("eu").Used, "eu heard nothing from us during the cut")
	n.deliver = nil
	n.run(3 * testKnobs().Interval)
	require.Equal(t, uint64(50), remote("eu").Used, "eu counts us's 50 after healing")
	require.Equal(t, uint64(350), remote("ap").Used, "ap adds eu's 300 and us's 50")

	// A newer window replaces the old sums.
	count("eu", win+1, 10)
	count("us", win+1, 0)
	n.run(3 * testKnobs().Interval)
	require.Equal(t, QuotaCount{Window: win + 1, Used: 10}, remote("ap"))
}
