package node_test

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/node/nodetest"
	"github.com/allot-dev/allot/internal/server"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
	"github.com/allot-dev/allot/region"
)

// TestRedisTLSAndACLUser runs a node against a redis-server that serves
// TLS only, requires client certificates and has no default user: only
// the ACL user "allot" with its password gets in.
func TestRedisTLSAndACLUser(t *testing.T) {
	f := newTLSFixture(t)
	srv := redistest.ServerWith(t, redistest.Options{
		TLS:   &redistest.TLS{CertFile: f.certFile, KeyFile: f.keyFile, CAFile: f.caFile},
		Users: map[string]string{"allot": "s3cret"},
	})
	ctx := context.Background()
	full := node.Transport{RedisUsername: "allot", RedisPassword: "s3cret", RedisTLS: f.client(t, true)}

	// What is refused, straight through package region as the node uses it.
	for name, tr := range map[string]node.Transport{
		"plaintext":          {RedisUsername: "allot", RedisPassword: "s3cret"},
		"no password":        {RedisTLS: f.client(t, true)},
		"wrong password":     {RedisUsername: "allot", RedisPassword: "guess", RedisTLS: f.client(t, true)},
		"no client cert":     {RedisUsername: "allot", RedisPassword: "s3cret", RedisTLS: f.client(t, false)},
		"untrusted redis CA": {RedisUsername: "allot", RedisPassword: "s3cret", RedisTLS: &tls.Config{}},
	} {
		st, err := region.Open(ctx, []string{srv.Addr}, region.Options{
			Username: tr.RedisUsername, Password: tr.RedisPassword, TLSConfig: tr.RedisTLS, DialTimeout: 2 * time.Second,
		})
		if !assert.Error(t, err, name) {
			st.Close()
		}
	}

	st, err := region.Open(ctx, []string{srv.Addr}, region.Options{Username: full.RedisUsername, Password: full.RedisPassword, TLSConfig: full.RedisTLS})
	require.NoError(t, err)
	who, err := st.Client().Do(ctx, "ACL", "WHOAMI").Text()
	require.NoError(t, err)
	assert.Equal(t, "allot", who)
	require.NoError(t, st.Close())

	// A node with the full transport counts in that Redis.
	path := nodetest.PolicyFile(t, testPolicies)
	n, err := node.Start(ctx, node.Config{GRPCAddr: "127.0.0.1:0", Redis: []string{srv.Addr}, PoliciesPath: path, Transport: full})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, n.Close(5*time.Second)) })
	for want := int64(99); want >= 98; want-- {
		resp, err := server.NewGRPC(n.Decider()).CheckRateLimit(ctx, &ratelimitv1.RateLimitRequest{TenantId: "org_acme", Route: "/r"})
		require.NoError(t, err)
		assert.Equal(t, ratelimitv1.RateLimitResponse_ALLOWED, resp.GetDecision())
		assert.Equal(t, want, resp.GetRemaining())
	}
	_, err = node.Start(ctx, node.Config{GRPCAddr: "127.0.0.1:0", Redis: []string{srv.Addr}, PoliciesPath: path,
		Transport: node.Transport{RedisTLS: f.client(t, true)}})
	assert.Error(t, err, "a node without the ACL user's password does not start")
}
