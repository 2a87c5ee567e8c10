package server_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/memstore"
	"github.com/allot-dev/allot/internal/server"
	"github.com/allot-dev/allot/policy"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// deadlineAt is a decider whose context "expires" at the n-th check: the
// deadline of a batch passing midway.
type deadlineAt struct {
	*decide.Decider
	n, calls int
}

// CheckAppend is the servers' way in (server.Checker).
func (c *deadlineAt) CheckAppend(ctx context.Context, r *decide.Request, buf []decide.Status) (decide.Decision, error) {
	c.calls++
	if c.calls == c.n {
		return decide.Decision{}, context.DeadlineExceeded
	}
	return c.Decider.CheckAppend(ctx, r, buf)
}

// A batch that hits its deadline midway answers only the error, and the
// checks it had decided are given back: it counts nothing. Before, the
// first checks stayed counted.
func TestBatchFailedMidwayCountsNothing(t *testing.T) {
	set, err := policy.Load("t", []byte(`
policies:
  - {id: t, per: [tenant], limits: [{name: s, algorithm: token_bucket, limit: 10, period: 1h}]}
  - {id: w, per: [client], limits: [{name: s, algorithm: fixed_window, limit: 10, period: 1h}]}
`))
	require.NoError(t, err)
	d := decide.New(decide.Config{Store: memstore.New(nil), Policies: set})
	s := server.NewGRPC(&deadlineAt{Decider: d, n: 4})
	var reqs []*ratelimitv1.RateLimitRequest
	for range 5 {
		reqs = append(reqs, &ratelimitv1.RateLimitRequest{TenantId: "a", ClientIdentifier: "c"})
	}
	_, err = s.CheckRateLimitBatch(context.Background(), &ratelimitv1.BatchRateLimitRequest{Requests: reqs})
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)

	r := decide.Request{Tenant: "a", Client: "c"}
	require.NoError(t, decide.Validate(&r))
	dec, err := d.Check(context.Background(), &r)
	require.NoError(t, err)
	require.Len(t, dec.Statuses, 2)
	for _, st := range dec.Statuses {
		assert.Equal(t, int64(9), st.Remaining, "%s: only this check counted", st.PolicyID)
	}
}
