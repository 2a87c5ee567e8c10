package policy

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const leasedPolicy = `
  - id: p
    per: [tenant]
    precision: leased
    limits: [{name: l, algorithm: token_bucket, limit: 10, period: 1s}]
`

func TestRuntimeBlocksParse(t *testing.T) {
	doc := `
rebalance: {interval: 5s, gather: 0.3, heavy_hitter: 0.2, floor: 0, headroom: 0.5, smoothing: 1, decay: 0.4, share_ttl: 30m}
lease: {target_period: 500ms, ttl: 3s, low_watermark: 0.4, max_share: 0.2, cold_hits: 4}
policies:` + leasedPolicy
	f, err := Parse("t", []byte(doc))
	require.NoError(t, err)
	require.NoError(t, Validate("t", f))
	r := f.Rebalance
	require.NotNil(t, r)
	assert.Equal(t, Duration(5*time.Second), r.Interval)
	assert.Equal(t, Duration(30*time.Minute), r.ShareTTL)
	require.NotNil(t, r.Floor, "an explicit 0 is a value, not an absent knob")
	assert.Zero(t, *r.Floor)
	assert.Equal(t, 0.4, *r.Decay)
	assert.Equal(t, 1.0, *r.Smoothing)

	s, err := Compile("t", f)
	require.NoError(t, err)
	assert.Equal(t, LeaseKnobs{TargetPeriod: Duration(500 * time.Millisecond), TTL: Duration(3 * time.Second), LowWatermark: 0.4, MaxShare: 0.2, ColdHits: 4}, s.LeaseDefaults())

	// JSON (the settings document in NATS, PostgreSQL and the admin API)
	// carries the same field names and leaves absent knobs absent.
	js, err := json.Marshal(f)
	require.NoError(t, err)
	assert.Contains(t, string(js), `"rebalance":{"interval":"5s","gather":0.3,"heavy_hitter":0.2,"floor":0,`)
	assert.Contains(t, string(js), `"lease":{"target_period":"500ms","ttl":"3s","low_watermark":0.4,"max_share":0.2,"cold_hits":4}`)
	back, err := Parse("t", js)
	require.NoError(t, err)
	assert.Equal(t, f, back)

	js, err = json.Marshal(&File{Rebalance: &RebalanceKnobs{Decay: f.Rebalance.Decay}})
	require.NoError(t, err)
	assert.JSONEq(t, `{"tenants":null,"default_tier":"","costs":null,"policies":null,"rebalance":{"decay":0.4}}`, string(js))
}

func TestRuntimeBlocksWithoutThemChangeNothing(t *testing.T) {
	s, err := Load("t", []byte("policies:"+leasedPolicy))
	require.NoError(t, err)
	assert.Zero(t, s.LeaseDefaults())
}

func TestRuntimeBlocksListEveryProblem(t *testing.T) {
	bad := `
rebalance: {interval: 5ms, gather: 0.5, heavy_hitter: -0.1, floor: 1.5, headroom: 11, smoothing: 0, decay: 2, share_ttl: 10ms}
lease: {target_period: 5ms, ttl: 2h, low_watermark: 1, max_share: 1.5, cold_hits: 256}
policies:` + leasedPolicy
	_, err := Load("t", []byte(bad))
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	var fields []string
	for _, p := range ve.Problems {
		fields = append(fields, p.Policy+" "+p.Field)
	}
	assert.ElementsMatch(t, []string{
		" rebalance.interval", " rebalance.gather", " rebalance.heavy_hitter", " rebalance.floor",
		" rebalance.headroom", " rebalance.smoothing", " rebalance.decay", " rebalance.share_ttl",
		" lease.target_period", " lease.ttl", " lease.low_watermark", " lease.max_share", " lease.cold_hits",
	}, fields)
	assert.Contains(t, err.Error(), "lease.cold_hits: 256 out of range [1, 255]")
	assert.Contains(t, err.Error(), "rebalance.decay: 2 out of range [0, 1]")

	_, err = Load("t", []byte("rebalance: {interval: 1m, share_ttl: 90s}\n"))
	require.ErrorAs(t, err, &ve)
	require.Len(t, ve.Problems, 1)
	assert.Equal(t, Problem{Field: "rebalance.share_ttl", Msg: "1m30s: want at least two intervals (2m0s)"}, ve.Problems[0])

	_, err = Load("t", []byte("lease: {target_period: 2s, ttl: 1s}\n"))
	require.ErrorAs(t, err, &ve)
	assert.Equal(t, []Problem{{Field: "lease.ttl", Msg: "1s is shorter than lease.target_period 2s: grants would expire before use"}}, ve.Problems)
}

// A policy's own knob and the file's lease block must agree once
// combined, or the policy's leases could never be granted.
func TestLeaseDefaultsCombineWithPolicyKnobs(t *testing.T) {
	doc := `
lease: {target_period: 2s}
policies:
  - id: p
    per: [tenant]
    precision: leased
    lease: {ttl: 1s}
    limits: [{name: l, algorithm: token_bucket, limit: 10, period: 1s}]
  - id: q
    per: [tenant]
    precision: leased
    lease: {ttl: 3s}
    limits: [{name: l, algorithm: token_bucket, limit: 10, period: 1s}]
`
	_, err := Load("t", []byte(doc))
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	require.Len(t, ve.Problems, 1)
	assert.Equal(t, "p", ve.Problems[0].Policy)
	assert.Equal(t, "lease.ttl", ve.Problems[0].Field)
}
