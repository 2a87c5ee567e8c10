package decide_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/memstore"
	"github.com/allot-dev/allot/policy"
)

// Every spelling of one address is one bucket and match.ip applies to it:
// before policy.ParseIP a zone suffix was a fresh bucket the fe80::/10
// policy did not even match.
func TestSpellingsOfOneAddressShareOneBucket(t *testing.T) {
	set, err := policy.Load("ip", []byte(`
policies:
  - id: link-local
    match: {ip: "fe80::/10"}
    per: [ip]
    limits:
      - {name: per_min, algorithm: token_bucket, limit: 3, period: 1m}
  - id: v4
    match: {ip: "10.0.0.0/8"}
    per: [ip]
    limits:
      - {name: per_min, algorithm: token_bucket, limit: 3, period: 1m}
`))
	require.NoError(t, err)
	d := decide.New(decide.Config{Store: memstore.New(nil), Policies: set})
	for _, spellings := range [][]string{
		{"fe80::1", "fe80::1%a", "FE80:0::1%b", "fe80:0:0:0:0:0:0:1%eth0"},
		{"10.0.0.1", "::ffff:10.0.0.1", "::FFFF:10.0.0.1", "::ffff:a00:1"},
	} {
		for i, ip := range spellings {
			dec := check(t, d, decide.Request{IPText: ip})
			require.NotEmpty(t, dec.Statuses, "%s: no policy matched", ip)
			if i < 3 {
				assert.Equal(t, decide.Allowed, dec.Outcome, ip)
			} else {
				assert.Equal(t, decide.Throttled, dec.Outcome, "%s is a fourth call on %s's bucket", ip, spellings[0])
			}
		}
	}
}
