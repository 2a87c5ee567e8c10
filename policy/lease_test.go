package policy

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLeaseKnobs(t *testing.T) {
	good := `
policies:
  - id: p
    per: [tenant]
    precision: leased
    lease: {target_period: 500ms, ttl: 2s, low_watermark: 0.3, max_share: 0.25}
    limits: [{name: l, algorithm: token_bucket, limit: 10, period: 1s}]
`
	s, err := Load("t", []byte(good))
	require.NoError(t, err)
	k := s.policies[0].Lease
	assert.Equal(t, LeaseKnobs{TargetPeriod: Duration(500 * time.Millisecond), TTL: Duration(2 * time.Second), LowWatermark: 0.3, MaxShare: 0.25}, k)

	bad := `
policies:
  - id: p
    precision: exact
    lease: {target_period: 1ms, ttl: 2s, low_watermark: 1, max_share: 2}
    limits: [{name: l, algorithm: token_bucket, limit: 10, period: 1s}]
  - id: q
    precision: leased
    lease: {target_period: 2s, ttl: 1s}
    limits: [{name: l, algorithm: token_bucket, limit: 10, period: 1s}]
`
	_, err = Load("t", []byte(bad))
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	var fields []string
	for _, p := range ve.Problems {
		fields = append(fields, p.Policy+" "+p.Field)
	}
	assert.ElementsMatch(t, []string{"p lease", "p lease.target_period", "p lease.low_watermark", "p lease.max_share", "q lease.ttl"}, fields)
}
