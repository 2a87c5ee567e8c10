package policy

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAppendSubjectMatchesSubject(t *testing.T) {
	for _, per := range [][]Field{nil, {FieldTenant}, {FieldTenant, FieldIP}, {FieldClient, FieldRoute, FieldMethod, FieldTier}, {FieldIP}} {
		p := &Compiled{Per: per}
		for _, r := range []Request{
			{Tenant: "acme", Client: "u1", Route: "/v1/x", Method: "GET", IP: netip.MustParseAddr("10.0.0.1")},
			{Tenant: "a{b}c%d,e=f", Client: "é", IP: netip.MustParseAddr("::ffff:1.2.3.4")},
			{Tenant: "x", IP: netip.MustParseAddr("2001:db8::1")},
			{Tenant: "no-ip"},
		} {
			var buf [16]byte
			assert.Equal(t, p.Subject(&r, "pro"), string(p.AppendSubject(buf[:0], &r, "pro")))
		}
	}
}

func TestAppendSubjectDoesNotAllocate(t *testing.T) {
	p := &Compiled{Per: []Field{FieldTenant, FieldIP}}
	r := Request{Tenant: "acme", IP: netip.MustParseAddr("10.1.2.3")}
	var buf [128]byte
	allocs := testing.AllocsPerRun(100, func() { _ = p.AppendSubject(buf[:0], &r, "") })
	assert.Zero(t, allocs)
}

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
