package node_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/testenv/faultproxy"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/policy"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// During a Redis outage every failed lease refill logged a line (954 in
// a 3 s stall at 200 req/s); now one per message per 10 s gets through.
func TestOutageLogLinesAreRateLimited(t *testing.T) {
	redistest.Require(t)
	in := redistest.Server(t)
	p := faultproxy.New(t, in.Addr)
	var logs syncBuffer
	n, err := node.Start(context.Background(), node.Config{
		GRPCAddr: "127.0.0.1:0", Redis: []string{p.Addr}, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		PoliciesPath: policyFile(t, `
policies:
  - {id: api, per: [tenant], precision: leased, on_store_failure: open, limits: [{name: s, algorithm: token_bucket, limit: 1000, period: 1s}]}
  - {id: ex, per: [client], on_store_failure: open, limits: [{name: s, algorithm: token_bucket, limit: 1000, period: 1s}]}
`),
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, n.Close(5*time.Second)) })
	p.Cut()
	p.BlackHole(true)
	const checks = 40
	for i := range checks {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		// One tenant: after its first (cold, exact) check it is leased,
		// and each check finds no tokens and asks for a refill.
		_, err := n.Decider().Check(ctx, &policy.Request{Tenant: "t", Client: fmt.Sprintf("c%d", i)})
		cancel()
		require.NoError(t, err)
	}
	out := logs.String()
	refill := strings.Count(out, "lease refill failed")
	require.GreaterOrEqual(t, refill, 1, "refills failed: %s", out)
	assert.LessOrEqual(t, refill, 1, "one line per 10 s, not one per failed refill:\n%s", out)
}
