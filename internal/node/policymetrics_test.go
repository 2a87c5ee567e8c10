package node_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/node/nodetest"
	"github.com/allot-dev/allot/internal/telemetry"
)

// A rejected policy push shows in metrics, not only in the log: a counter,
// a "rejected" gauge and the applied set's time and revision.
func TestRejectedPolicySetIsAMetric(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, tel.Shutdown(context.Background())) })
	path := nodetest.PolicyFile(t, testPolicies)
	n, err := node.Start(context.Background(), node.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", PoliciesPath: path, Telemetry: tel})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, n.Close(5*time.Second)) })
	hc := oneConn(t)

	fams := scrape(t, hc, n.HTTPAddr())
	assert.Equal(t, 0.0, mustSample(t, fams, "allot_policy_set_rejections_total", nil))
	assert.Equal(t, 0.0, mustSample(t, fams, "allot_policy_set_rejected", nil))
	assert.Equal(t, 2.0, mustSample(t, fams, "allot_policy_set_policies", nil))
	appliedAt := mustSample(t, fams, "allot_policy_set_applied_timestamp_seconds", nil)
	assert.InDelta(t, float64(time.Now().Unix()), appliedAt, 60)

	require.NoError(t, os.WriteFile(path, []byte("policies:\n  - {id: bad, limits: []}\n"), 0o600))
	require.Eventually(t, func() bool {
		v, ok := sample(scrape(t, hc, n.HTTPAddr()), "allot_policy_set_rejections_total", nil)
		return ok && v == 1
	}, 10*time.Second, 20*time.Millisecond)
	fams = scrape(t, hc, n.HTTPAddr())
	assert.Equal(t, 1.0, mustSample(t, fams, "allot_policy_set_rejected", nil))
	assert.Equal(t, 2.0, mustSample(t, fams, "allot_policy_set_policies", nil), "the last good set stays in force")
}
