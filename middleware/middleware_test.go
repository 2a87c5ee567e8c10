package middleware_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/allot-dev/allot/client"
	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/node/nodetest"
	"github.com/allot-dev/allot/middleware"
	"github.com/allot-dev/allot/problem"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
	"github.com/allot-dev/allot/ratelimitheaders/ratelimitheaderstest"
)

const policies = `
policies:
  - id: per-key
    match: {}
    per: [client]
    limits:
      - {name: per_minute, algorithm: token_bucket, limit: 2, period: 1m}
`

// patient is the check timeout of tests that expect the node's answer:
// the 20ms default fails open on a loaded CI machine, and failing open is
// tested on its own.
const patient = 30 * time.Second

// startNode runs a standalone node with gRPC and HTTP on real listeners.
func startNode(t *testing.T) (*node.Node, ratelimitv1.RateLimiterServiceClient) {
	t.Helper()
	n, conn := nodetest.Start(t, policies, node.Config{HTTPAddr: "127.0.0.1:0"})
	return n, ratelimitv1.NewRateLimiterServiceClient(conn)
}

// app counts the requests that reached it.
type app struct{ hits atomic.Int64 }

func (a *app) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	a.hits.Add(1)
	_, _ = io.WriteString(w, "hello")
}

func serve(t *testing.T, opts middleware.Options) (string, *app) {
	t.Helper()
	l, err := middleware.New(opts)
	require.NoError(t, err)
	a := &app{}
	srv := httptest.NewServer(l.Wrap(a))
	t.Cleanup(srv.Close)
	return srv.URL, a
}

func do(t *testing.T, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// rateHeaders are the fields both faces must agree on.
var rateHeaders = []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After", "RateLimit-Policy", "RateLimit", "X-RateLimit-Status", "Content-Type"}

// TestMiddlewareMatchesHTTPCheck: the same sequence through the middleware
// and through the node's POST /v1/check gives the same fields and the
// same problem document.
// It holds for both ways of asking: the generated gRPC stub and package
// client (whose deny cache answers nothing here: each 429 is the first
// throttle of its key).
func TestMiddlewareMatchesHTTPCheck(t *testing.T) {
	for _, via := range []string{"FromClient", "FromAllot"} {
		t.Run(via, func(t *testing.T) { testMiddlewareMatchesHTTPCheck(t, via) })
	}
}

func testMiddlewareMatchesHTTPCheck(t *testing.T, via string) {
	n, stub := startNode(t)
	check := middleware.FromClient(stub)
	if via == "FromAllot" {
		c, err := client.New([]string{n.Addr()})
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, c.Close()) })
		check = middleware.FromAllot(c)
	}
	url, a := serve(t, middleware.Options{Check: check, Identity: middleware.Identity{APIKeyHeader: "X-API-Key"}, Timeout: patient})
	viaMiddleware := func() (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodGet, url+"/v1/orders", nil)
		req.Header.Set("X-API-Key", "sk_a")
		return do(t, req)
	}
	viaCheck := func() (*http.Response, string) {
		body := `{"client_identifier":"` + middleware.APIKeyID("sk_b") + `","route":"/v1/orders","method":"GET","ip":"127.0.0.1"}`
		req, _ := http.NewRequest(http.MethodPost, "http://"+n.HTTPAddr()+"/v1/check", strings.NewReader(body))
		return do(t, req)
	}
	for i, wantStatus := range []int{200, 200, 429} {
		mw, mwBody := viaMiddleware()
		ck, ckBody := viaCheck()
		require.Equal(t, wantStatus, mw.StatusCode, "request %d: %s", i, mwBody)
		require.Equal(t, wantStatus, ck.StatusCode, "request %d: %s", i, ckBody)
		f, err := ratelimitheaderstest.Parse(mw.Header)
		require.NoError(t, err)
		require.Len(t, f.Policy, 1)
		assert.Equal(t, map[string]int64{"q": 2, "w": 60}, f.Policy[0].Params)
		assert.Equal(t, "per-key/per_minute", f.RateLimit[0].Name)
		for _, h := range rateHeaders {
			if h == "Content-Type" && wantStatus == 200 {
				continue // the app's answer vs the check's JSON
			}
			assert.Equal(t, ck.Header.Values(h), mw.Header.Values(h), "request %d: %s", i, h)
		}
		if wantStatus == 429 {
			assert.Equal(t, "30", mw.Header.Get("Retry-After")) // 1 token at 2/min
			assert.Equal(t, map[string]int64{"r": 0, "t": 30}, f.RateLimit[0].Params)
			var mp, cp map[string]any
			require.NoError(t, json.Unmarshal([]byte(mwBody), &mp))
			require.NoError(t, json.Unmarshal([]byte(ckBody), &cp))
			assert.Equal(t, cp, mp)
			assert.Equal(t, problem.QuotaExceeded, mp["type"])
			assert.Equal(t, "/v1/orders", mp["instance"])
			assert.Equal(t, float64(30), mp["retry_after_seconds"])
			assert.Equal(t, []any{"per-key/per_minute"}, mp["violated-policies"])
		} else {
			assert.Equal(t, "hello", mwBody)
		}
	}
	assert.Equal(t, int64(2), a.hits.Load(), "the throttled request never reached the app")
}

func TestMiddlewareFailsOpenOnTimeout(t *testing.T) {
	// A node that never answers: the check waits for its deadline.
	var observed atomic.Value
	url, a := serve(t, middleware.Options{
		Check: func(ctx context.Context, _ *ratelimitv1.RateLimitRequest) (*ratelimitv1.RateLimitResponse, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		},
		Timeout: time.Millisecond,
		Observe: func(_ context.Context, _ *ratelimitv1.RateLimitResponse, err error, _ time.Duration) {
			observed.Store(err)
		},
	})
	req, _ := http.NewRequest(http.MethodGet, url+"/x", nil)
	resp, body := do(t, req)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "hello", body)
	assert.Equal(t, "Bypass", resp.Header.Get("X-RateLimit-Status"))
	assert.Empty(t, resp.Header.Values("X-RateLimit-Limit"))
	assert.Equal(t, int64(1), a.hits.Load())
	assert.ErrorIs(t, observed.Load().(error), context.DeadlineExceeded)
}

func TestMiddlewareFailsOpenWhenNodeIsDown(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close()) // nothing listens there now
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	url, a := serve(t, middleware.Options{Check: middleware.FromClient(ratelimitv1.NewRateLimiterServiceClient(conn))})
	req, _ := http.NewRequest(http.MethodGet, url+"/x", nil)
	resp, _ := do(t, req)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "Bypass", resp.Header.Get("X-RateLimit-Status"))
	assert.Equal(t, int64(1), a.hits.Load())
}

// Through package client too, a node that is down means Bypass.
func TestMiddlewareFromAllotFailsOpenWhenNodeIsDown(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close())
	c, err := client.New([]string{addr})
	require.NoError(t, err)
	defer c.Close()
	url, a := serve(t, middleware.Options{Check: middleware.FromAllot(c), Timeout: patient})
	req, _ := http.NewRequest(http.MethodGet, url+"/x", nil)
	resp, _ := do(t, req)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "Bypass", resp.Header.Get("X-RateLimit-Status"))
	assert.Equal(t, int64(1), a.hits.Load())
}

func TestMiddlewareRejectsBadIdentity(t *testing.T) {
	_, client := startNode(t)
	url, a := serve(t, middleware.Options{Check: middleware.FromClient(client), Identity: middleware.Identity{TenantHeader: "X-Tenant"}, Timeout: patient})
	req, _ := http.NewRequest(http.MethodGet, url+"/x", nil)
	req.Header.Set("X-Tenant", strings.Repeat("t", 300))
	resp, body := do(t, req)
	// Failing open here would let any caller skip the limiter.
	assert.Equal(t, 400, resp.StatusCode, body)
	assert.Equal(t, problem.ContentType, resp.Header.Get("Content-Type"))
	assert.Contains(t, body, "tenant_id")
	assert.Equal(t, int64(0), a.hits.Load())
}

func TestNewValidates(t *testing.T) {
	_, err := middleware.New(middleware.Options{})
	assert.Error(t, err)
}
