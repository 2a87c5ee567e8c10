package policy_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/policy"
)

func TestWarningsForFieldsTheMatchDoesNotRequire(t *testing.T) {
	f, err := policy.Parse("t", []byte(`
policies:
  - {id: ip-any, per: [ip], limits: [{name: s, algorithm: token_bucket, limit: 1, period: 1s}]}
  - {id: ip-v4, match: {ip: 0.0.0.0/0}, per: [ip], limits: [{name: s, algorithm: token_bucket, limit: 1, period: 1s}]}
  - {id: ip-tier, match: {tier: free}, per: [ip], limits: [{name: s, algorithm: token_bucket, limit: 1, period: 1s}]}
  - {id: client-any, per: [client], limits: [{name: s, algorithm: token_bucket, limit: 1, period: 1s}]}
  - {id: client-route, match: {route: /login}, per: [client], limits: [{name: s, algorithm: token_bucket, limit: 1, period: 1s}]}
  - {id: tier-any, per: [tier], limits: [{name: s, algorithm: token_bucket, limit: 1, period: 1s}]}
`))
	require.NoError(t, err)
	var ids []string
	for _, w := range policy.Warnings(f) {
		ids = append(ids, w.Policy)
	}
	assert.Equal(t, []string{"ip-any", "ip-tier", "client-any"}, ids)
}

// The shipped example must not trap new users: it validates with no warning.
func TestExamplePoliciesHaveNoWarnings(t *testing.T) {
	data, err := os.ReadFile("../examples/policies.yaml")
	require.NoError(t, err)
	f, err := policy.Parse("examples/policies.yaml", data)
	require.NoError(t, err)
	_, err = policy.Compile("examples/policies.yaml", f)
	require.NoError(t, err)
	assert.Empty(t, policy.Warnings(f))
}

// "." and ".." validated but no admin path can name them.
func TestDotIDsAreRejected(t *testing.T) {
	for _, id := range []string{".", ".."} {
		_, err := policy.Load("t", []byte(`{"policies":[{"id":"`+id+`","per":["tenant"],"limits":[{"name":"s","algorithm":"token_bucket","limit":2,"period":"1s"}]}]}`))
		require.Error(t, err, id)
		assert.Contains(t, err.Error(), "path segment")
	}
	_, err := policy.Load("t", []byte(`{"policies":[{"id":"...","per":["tenant"],"limits":[{"name":"s","algorithm":"token_bucket","limit":2,"period":"1s"}]}]}`))
	assert.NoError(t, err, "other dotted ids stay valid")
}
