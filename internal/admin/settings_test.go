package admin_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/admin"
	"github.com/allot-dev/allot/internal/policystore"
	"github.com/allot-dev/allot/policy"
)

const runtimeSettings = `{"default_tier":"free",
 "rebalance":{"interval":"5s","heavy_hitter":0.2,"floor":0,"decay":0.5,"share_ttl":"10m"},
 "lease":{"target_period":"500ms","ttl":"3s","max_share":0.2}}`

func TestSettingsCarryTheRuntimeBlocks(t *testing.T) {
	srv, store := serve(t)
	resp, body := call(t, srv, "PUT", "/v1/settings", token, runtimeSettings)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)

	resp, body = call(t, srv, "GET", "/v1/settings", "", "")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, `"1"`, resp.Header.Get("ETag"))
	var got policystore.Settings
	require.NoError(t, json.Unmarshal([]byte(body), &got))
	require.NotNil(t, got.Rebalance)
	require.NotNil(t, got.Rebalance.Floor, "an explicit floor of 0 survives the round trip")
	assert.Zero(t, *got.Rebalance.Floor)
	assert.Equal(t, 0.5, *got.Rebalance.Decay)
	assert.Nil(t, got.Rebalance.Gather, "an absent knob stays absent")
	assert.Equal(t, policy.Duration(5*time.Second), got.Rebalance.Interval)
	assert.Equal(t, &policy.LeaseKnobs{TargetPeriod: policy.Duration(500 * time.Millisecond), TTL: policy.Duration(3 * time.Second), MaxShare: 0.2}, got.Lease)

	// What the nodes and coordinators load is the same document.
	f, _, err := store.Load(context.Background())
	require.NoError(t, err)
	assert.Equal(t, got.Rebalance, f.Rebalance)
	assert.Equal(t, got.Lease, f.Lease)

	// The typed client sees the same.
	c := admin.NewClient(srv.URL, token, srv.Client())
	st, err := c.Settings(context.Background())
	require.NoError(t, err)
	assert.Equal(t, got, st)
}

func TestBadRuntimeSettingsListEveryProblem(t *testing.T) {
	srv, store := serve(t)
	bad := `{"rebalance":{"interval":"1ms","gather":0.9,"decay":-1},"lease":{"ttl":"2h","low_watermark":1}}`
	resp, body := call(t, srv, "PUT", "/v1/settings", token, bad)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
	var fields []string
	for _, e := range problemOf(t, resp, body).Errors {
		assert.Empty(t, e.Policy)
		fields = append(fields, e.Field)
	}
	assert.ElementsMatch(t, []string{"rebalance.interval", "rebalance.gather", "rebalance.decay", "lease.ttl", "lease.low_watermark"}, fields)
	st, err := store.Settings(context.Background())
	require.NoError(t, err)
	assert.Zero(t, st.Version, "nothing stored")

	// Validated with the stored policies: the document's target period
	// outlasts a stored policy's own lease ttl.
	resp, body = call(t, srv, "PUT", "/v1/policies/p", token, `{"id":"p","per":["tenant"],"precision":"leased","lease":{"ttl":"1s"},
	 "limits":[{"name":"l","algorithm":"token_bucket","limit":5,"period":"1s"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	resp, body = call(t, srv, "PUT", "/v1/settings", token, `{"lease":{"target_period":"2s"}}`)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
	errs := problemOf(t, resp, body).Errors
	require.Len(t, errs, 1)
	assert.Equal(t, "p", errs[0].Policy)
	assert.Equal(t, "lease.ttl", errs[0].Field)
}

// The dry run tells a settings-only file from a policy with a lease block.
func TestValidateTellsALeaseBlockFileFromAPolicy(t *testing.T) {
	srv, _ := serve(t)
	resp, body := call(t, srv, "POST", "/v1/policies:validate", token, `{"lease":{"max_share":2}}`)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
	errs := problemOf(t, resp, body).Errors
	require.Len(t, errs, 1)
	assert.Equal(t, "lease.max_share", errs[0].Field)
	assert.Empty(t, errs[0].Policy, "read as a file")

	resp, body = call(t, srv, "POST", "/v1/policies:validate", token, `{"rebalance":{"decay":0.1}}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)

	resp, body = call(t, srv, "POST", "/v1/policies:validate", token, `{"id":"p","per":["tenant"],"precision":"leased","lease":{"max_share":0.5},
	 "limits":[{"name":"l","algorithm":"token_bucket","limit":5,"period":"1s"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
}
