package coord

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/bucket"
	"github.com/allot-dev/allot/policy"
)

// The limits come from the nodes' compiled set: its algorithm names, burst
// defaults and rates, and only for global scope.
func TestPolicyLimitsReadTheCompiledSet(t *testing.T) {
	set, err := policy.Load("t", []byte(`
policies:
  - id: g
    per: [tenant]
    scope: global
    limits:
      - {name: rps, algorithm: token_bucket, limit: 600, period: 1m}
      - {name: burst, algorithm: token_bucket, limit: 10, period: 1s, burst: 40}
      - {name: day, algorithm: fixed_window, limit: 1000, period: 24h}
      - {name: gcra, algorithm: gcra, limit: 10, period: 1s}
  - id: local
    per: [tenant]
    limits: [{name: rps, algorithm: token_bucket, limit: 5, period: 1s}]
`))
	require.NoError(t, err)
	l := NewPolicyLimits(set)
	key := func(pol, lim string) string { return bucket.New("tenant=a", pol, lim).String() }

	got, ok := l.Global(key("g", "rps"))
	require.True(t, ok)
	assert.Equal(t, Limit{Rate: 10, Burst: 600}, got, "burst defaults to the limit")
	got, ok = l.Global(key("g", "burst"))
	require.True(t, ok)
	assert.Equal(t, Limit{Rate: 10, Burst: 40}, got)
	q, ok := l.Quota(key("g", "day"))
	require.True(t, ok)
	assert.Equal(t, Quota{Limit: 1000, Window: 24 * time.Hour}, q)
	for _, k := range []string{key("g", "day"), key("g", "gcra"), key("local", "rps"), "not a key"} {
		_, ok := l.Global(k)
		assert.False(t, ok, k)
	}
	_, ok = l.Quota(key("g", "rps"))
	assert.False(t, ok)
	l.Update(nil)
	_, ok = l.Global(key("g", "rps"))
	assert.False(t, ok, "an empty set has no limits")
}
