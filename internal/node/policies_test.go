package node_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/allot-dev/allot/internal/admin"
	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/policystore"
	"github.com/allot-dev/allot/internal/testenv/natstest"
	"github.com/allot-dev/allot/internal/testenv/pgtest"
	"github.com/allot-dev/allot/policy"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

const adminToken = "t0ken"

// perTenant allows limit requests per hour per tenant: over a test's few
// seconds the bucket refills by much less than one token, so remaining
// counts checks exactly.
func perTenant(limit int64) policy.Policy {
	return policy.Policy{
		ID:     "per-tenant",
		Per:    []policy.Field{policy.FieldTenant},
		Limits: []policy.Limit{{Name: "per_hour", Algorithm: "token_bucket", Limit: limit, Period: policy.Duration(time.Hour)}},
	}
}

// storeCase is one kind of store for the live-policy acceptance test:
// its URL, and how to write a bad set into it around the admin API.
type storeCase struct {
	url      string
	writeBad func(t *testing.T)
}

func TestLivePoliciesFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policies.yaml")
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	testLivePolicies(t, storeCase{url: "file:" + path, writeBad: func(t *testing.T) {
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		bad := strings.Replace(string(data), "limit: 2000", "limit: 0", 1)
		require.NotEqual(t, string(data), bad)
		require.NoError(t, os.WriteFile(path, []byte(bad), 0o600))
	}})
}

func TestLivePoliciesNATS(t *testing.T) {
	url := natstest.Server(t)
	testLivePolicies(t, storeCase{url: url, writeBad: func(t *testing.T) {
		nc, err := nats.Connect(url)
		require.NoError(t, err)
		defer nc.Close()
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		kv, err := js.KeyValue(context.Background(), policystore.Bucket)
		require.NoError(t, err)
		_, err = kv.Put(context.Background(), "policy.per-tenant",
			[]byte(`{"id":"per-tenant","per":["tenant"],"limits":[{"name":"per_hour","algorithm":"token_bucket","limit":0,"period":"1h"}]}`))
		require.NoError(t, err)
	}})
}

func TestLivePoliciesPostgres(t *testing.T) {
	url := pgtest.Database(t)
	testLivePolicies(t, storeCase{url: url, writeBad: func(t *testing.T) {
		conn, err := pgx.Connect(context.Background(), url)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		_, err = conn.Exec(context.Background(), `UPDATE allot_policies SET body = jsonb_set(body, '{limits,0,limit}', '0') WHERE id = 'per-tenant'`)
		require.NoError(t, err)
	}})
}

// testLivePolicies is the acceptance scenario: changes made through the
// admin API are enforced by a running node (each within 5 s, a deadline
// for a hang, not a speed: the times are logged), with the
// counters untouched; bad changes are rejected with all their problems
// and the node keeps enforcing the last good set.
func testLivePolicies(t *testing.T, sc storeCase) {
	ctx := context.Background()
	n, err := node.Start(ctx, node.Config{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "", StoreURL: sc.url,
		AdminAddr: "127.0.0.1:0", AdminToken: adminToken,
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, n.Close(5*time.Second)) })
	conn, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	rl := ratelimitv1.NewRateLimiterServiceClient(conn)
	ac := admin.NewClient("http://"+n.AdminAddr(), adminToken, nil)

	checks := int64(0) // every check takes one token from acme's bucket
	check := func() *ratelimitv1.RateLimitResponse {
		t.Helper()
		resp, err := rl.CheckRateLimit(ctx, &ratelimitv1.RateLimitRequest{TenantId: "acme", ClientIdentifier: "u1"})
		require.NoError(t, err)
		if resp.PolicyId == "per-tenant" {
			checks++
		}
		return resp
	}
	// awaitLimit checks until the node enforces limit, and says how long
	// that took after since.
	awaitLimit := func(limit int64, since time.Time) time.Duration {
		t.Helper()
		deadline := since.Add(5 * time.Second)
		for {
			if resp := check(); resp.Limit == limit && resp.PolicyId == "per-tenant" {
				return time.Since(since)
			}
			require.True(t, time.Now().Before(deadline), "limit %d not enforced within 5s", limit)
			time.Sleep(5 * time.Millisecond) // poll interval
		}
	}

	// Create: enforced.
	start := time.Now()
	_, err = ac.Create(ctx, perTenant(1000))
	require.NoError(t, err)
	took := awaitLimit(1000, start)
	t.Logf("create enforced after %v", took)
	for range 3 {
		check()
	}
	resp := check()
	require.Equal(t, ratelimitv1.RateLimitResponse_ALLOWED, resp.Decision)
	require.Equal(t, 1000-checks, resp.Remaining)

	// Update: the new limit applies to the existing bucket.
	start = time.Now()
	_, err = ac.Put(ctx, perTenant(2000), 1)
	require.NoError(t, err)
	took = awaitLimit(2000, start)
	t.Logf("update enforced after %v", took)
	resp = check()
	assert.Equal(t, 1000-checks, resp.Remaining, "counters survive the reload: the bucket keeps its tokens")
	inForce := n.PolicyStatus().Applied

	// A bad change through the admin API: 400, every problem, nothing stored.
	bad := perTenant(0)
	bad.Limits[0].Algorithm = "leaky"
	bad.Per = append(bad.Per, "bogus")
	_, err = ac.Put(ctx, bad, policystore.AnyVersion)
	var prob *admin.Problem
	require.ErrorAs(t, err, &prob)
	assert.Equal(t, http.StatusBadRequest, prob.Status)
	fields := map[string]bool{}
	for _, e := range prob.Errors {
		fields[e.Field] = true
	}
	assert.Equal(t, map[string]bool{"per[1]": true, "limits[0].algorithm": true, "limits[0].limit": true}, fields)
	stored, err := ac.Get(ctx, "per-tenant")
	require.NoError(t, err)
	assert.Equal(t, int64(2), stored.Version)

	// A bad set written around the API: the node rejects it, keeps the
	// last known good set, and its counters.
	sc.writeBad(t)
	deadline := time.Now().Add(5 * time.Second)
	for n.PolicyStatus().Err == nil {
		require.True(t, time.Now().Before(deadline), "bad set not rejected within 5s")
		time.Sleep(5 * time.Millisecond) // poll interval
	}
	st := n.PolicyStatus()
	assert.Equal(t, inForce, st.Applied)
	assert.Contains(t, st.Err.Error(), `policy "per-tenant": limits[0].limit`)
	resp = check()
	assert.Equal(t, int64(2000), resp.Limit, "the old set is still enforced")
	assert.Equal(t, 1000-checks, resp.Remaining)

	// Fixing it through the API (which validates the whole resulting set)
	// brings the node back in line.
	start = time.Now()
	_, err = ac.Put(ctx, perTenant(3000), policystore.AnyVersion)
	require.NoError(t, err)
	t.Logf("fix enforced after %v", awaitLimit(3000, start))
	assert.NoError(t, n.PolicyStatus().Err)

	// Delete: no policy applies any more.
	start = time.Now()
	require.NoError(t, ac.Delete(ctx, "per-tenant", policystore.AnyVersion))
	for check().PolicyId != "" {
		require.Less(t, time.Since(start), 5*time.Second, "delete not enforced")
		time.Sleep(5 * time.Millisecond) // poll interval
	}
	t.Logf("delete enforced after %v", time.Since(start))
	hist, err := ac.History(ctx, "per-tenant")
	require.NoError(t, err)
	assert.True(t, hist[0].Deleted)
}

func TestAdminAPINeedsATokenOffLoopback(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	_, err := node.Start(context.Background(), node.Config{GRPCAddr: "127.0.0.1:0", PoliciesPath: path, AdminAddr: "0.0.0.0:0"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "needs a token")
	_, err = node.Start(context.Background(), node.Config{GRPCAddr: "127.0.0.1:0", PoliciesPath: path, StoreURL: "file:" + path})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not both")
}
