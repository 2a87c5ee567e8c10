package node_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/node/nodetest"
	"github.com/allot-dev/allot/middleware"
	"github.com/allot-dev/allot/problem"
	"github.com/allot-dev/allot/ratelimitheaders/ratelimitheaderstest"
)

const edgePolicies = `
default_tier: free
policies:
  - id: per-key
    match: {route: "/api/*"}
    per: [client]
    limits:
      - {name: per_minute, algorithm: token_bucket, limit: 2, period: 1m}
  - id: per-ip
    match: {route: "/ip/*"}
    per: [ip]
    limits:
      - {name: per_minute, algorithm: token_bucket, limit: 1, period: 1m}
  - id: free-tier
    match: {tier: free, route: "/rls"}
    per: [tenant]
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 5, period: 1s, burst: 10}
`

func startEdgeNode(t *testing.T, upstream string) *node.Node {
	t.Helper()
	path := nodetest.PolicyFile(t, edgePolicies)
	n, err := node.Start(context.Background(), node.Config{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", PoliciesPath: path,
		Upstream: upstream, ProxyAddr: "127.0.0.1:0",
		Identity: middleware.Identity{APIKeyHeader: "X-API-Key", TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}},
		// Patient: the 20ms default fails open on a loaded machine.
		CheckTimeout: 30 * time.Second,
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, n.Close(5*time.Second)) })
	return n
}

// recordingUpstream records what reached it.
type recordingUpstream struct {
	mu   sync.Mutex
	seen []*http.Request
}

func (u *recordingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.seen = append(u.seen, r.Clone(context.Background()))
	u.mu.Unlock()
	w.Header().Set("X-Upstream", "yes")
	_, _ = io.WriteString(w, "from upstream "+r.URL.Path)
}

func (u *recordingUpstream) requests() []*http.Request {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]*http.Request(nil), u.seen...)
}

func httpGet(t *testing.T, url string, headers ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

func TestReverseProxyPassesAllowedAndAnswers429(t *testing.T) {
	up := &recordingUpstream{}
	upSrv := httptest.NewServer(up)
	defer upSrv.Close()
	n := startEdgeNode(t, upSrv.URL)
	proxy := "http://" + n.ProxyAddr()

	for i := range 2 {
		resp, body := httpGet(t, proxy+"/api/orders?page=2", "X-API-Key", "sk_1")
		require.Equal(t, 200, resp.StatusCode, body)
		assert.Equal(t, "from upstream /api/orders", body)
		assert.Equal(t, "yes", resp.Header.Get("X-Upstream"))
		assert.Equal(t, "2", resp.Header.Get("X-RateLimit-Limit"))
		assert.Equal(t, []string{[]string{"1", "0"}[i]}, resp.Header.Values("X-RateLimit-Remaining"))
		f, err := ratelimitheaderstest.Parse(resp.Header)
		require.NoError(t, err)
		assert.Equal(t, "per-key/per_minute", f.Policy[0].Name)
	}
	resp, body := httpGet(t, proxy+"/api/orders", "X-API-Key", "sk_1")
	require.Equal(t, 429, resp.StatusCode, body)
	assert.Empty(t, resp.Header.Get("X-Upstream"), "answered by Allot, not the upstream")
	assert.Equal(t, "30", resp.Header.Get("Retry-After"))
	assert.Equal(t, problem.ContentType, resp.Header.Get("Content-Type"))
	var p map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &p))
	assert.Equal(t, problem.QuotaExceeded, p["type"])
	assert.Equal(t, "/api/orders", p["instance"])
	assert.Len(t, up.requests(), 2)

	// Another key has its own counter.
	resp, _ = httpGet(t, proxy+"/api/orders", "X-API-Key", "sk_2")
	assert.Equal(t, 200, resp.StatusCode)

	// The check API is not reachable through the proxy: it is proxied.
	resp, body = httpGet(t, proxy+"/v1/check")
	assert.Equal(t, "from upstream /v1/check", body)
	assert.Equal(t, 200, resp.StatusCode)
}

func TestReverseProxyTrustsForwardedForOnlyFromTrustedPeers(t *testing.T) {
	up := &recordingUpstream{}
	upSrv := httptest.NewServer(up)
	defer upSrv.Close()
	n := startEdgeNode(t, upSrv.URL)
	proxy := "http://" + n.ProxyAddr()

	// The test client is 127.0.0.1, a trusted proxy, so X-Forwarded-For
	// names the client: two clients, two counters of one request each.
	resp, _ := httpGet(t, proxy+"/ip/a", "X-Forwarded-For", "6.6.6.6, 198.51.100.1")
	assert.Equal(t, 200, resp.StatusCode)
	resp, _ = httpGet(t, proxy+"/ip/a", "X-Forwarded-For", "198.51.100.2")
	assert.Equal(t, 200, resp.StatusCode)
	// A spoofed left entry does not buy a new counter.
	resp, _ = httpGet(t, proxy+"/ip/a", "X-Forwarded-For", "7.7.7.7, 198.51.100.1")
	assert.Equal(t, 429, resp.StatusCode)

	seen := up.requests()
	require.Len(t, seen, 2)
	// The chain is kept and our peer appended, for the upstream's own rules.
	assert.Equal(t, "6.6.6.6, 198.51.100.1, 127.0.0.1", seen[0].Header.Get("X-Forwarded-For"))
}

func TestNodeHealthEndpointsAndShutdown(t *testing.T) {
	path := nodetest.PolicyFile(t, edgePolicies)
	n, err := node.Start(context.Background(), node.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", PoliciesPath: path})
	require.NoError(t, err)
	base := "http://" + n.HTTPAddr()
	for _, p := range []string{"/healthz", "/readyz"} {
		resp, _ := httpGet(t, base+p)
		assert.Equal(t, 200, resp.StatusCode, p)
	}
	assert.Empty(t, n.ProxyAddr())
	require.NoError(t, n.Close(5*time.Second))
	_, err = http.Get(base + "/healthz")
	assert.Error(t, err, "the HTTP listener is closed with the node")
}

func TestStartRejectsBadUpstream(t *testing.T) {
	for _, u := range []string{"ftp://x", "http://", "::"} {
		_, err := node.Start(context.Background(), node.Config{GRPCAddr: "127.0.0.1:0", Upstream: u, ProxyAddr: "127.0.0.1:0"})
		assert.Error(t, err, u)
	}
}

func rlsClient(t *testing.T, n *node.Node) rlsv3.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func rlsDescriptor(kv ...string) *ratelimitcommonv3.RateLimitDescriptor {
	d := &ratelimitcommonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitcommonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func TestEnvoyRateLimitService(t *testing.T) {
	n := startEdgeNode(t, "")
	c := rlsClient(t, n)
	ctx := context.Background()

	// hits_addend 10 takes the whole burst of 10.
	start := time.Now()
	resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 10,
		Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{rlsDescriptor("tenant", "org_free", "route", "/rls")}})
	require.NoError(t, err)
	assert.Equal(t, rlsv3.RateLimitResponse_OK, resp.OverallCode)
	require.Len(t, resp.Statuses, 1)
	st := resp.Statuses[0]
	assert.Equal(t, rlsv3.RateLimitResponse_OK, st.Code)
	assert.Equal(t, "free-tier/per_second", st.CurrentLimit.GetName())
	assert.Equal(t, uint32(5), st.CurrentLimit.GetRequestsPerUnit(), "5/s with a burst of 10: the quota per unit, not the burst")
	assert.Equal(t, rlsv3.RateLimitResponse_RateLimit_SECOND, st.CurrentLimit.GetUnit())
	assert.Equal(t, uint32(0), st.LimitRemaining)
	assert.InDelta(t, 2*time.Second, st.DurationUntilReset.AsDuration(), float64(100*time.Millisecond))
	h := map[string]string{}
	for _, hv := range resp.ResponseHeadersToAdd {
		h[hv.GetKey()] = hv.GetValue()
	}
	assert.Equal(t, "10", h["X-Ratelimit-Limit"])
	assert.Equal(t, "0", h["X-Ratelimit-Remaining"])
	assert.Equal(t, `"free-tier/per_second";q=5;w=1`, h["Ratelimit-Policy"])
	assert.Empty(t, resp.RawBody)

	// Two descriptors, one over: the whole request is OVER_LIMIT; a
	// descriptor's own hits_addend wins over the request's.
	resp, err = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 10,
		Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{
			rlsDescriptor("tenant", "org_other", "route", "/rls"),
			func() *ratelimitcommonv3.RateLimitDescriptor {
				d := rlsDescriptor("tenant", "org_free", "route", "/rls")
				d.HitsAddend = wrapperspb.UInt64(1)
				return d
			}(),
		}})
	require.NoError(t, err)
	assert.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, resp.OverallCode)
	require.Len(t, resp.Statuses, 2)
	assert.Equal(t, rlsv3.RateLimitResponse_OK, resp.Statuses[0].Code)
	assert.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, resp.Statuses[1].Code)
	// One token at 5/s, less what refilled since the first call (a loaded
	// machine may take a while between the two).
	reset := resp.Statuses[1].DurationUntilReset.AsDuration()
	assert.LessOrEqual(t, reset, 200*time.Millisecond)
	assert.GreaterOrEqual(t, reset, 200*time.Millisecond-time.Since(start)-time.Millisecond)
	h = map[string]string{}
	for _, hv := range resp.ResponseHeadersToAdd {
		h[hv.GetKey()] = hv.GetValue()
	}
	assert.Equal(t, "1", h["Retry-After"])
	assert.Equal(t, problem.ContentType, h["Content-Type"])
	hdr := http.Header{}
	for k, v := range h {
		hdr.Set(k, v)
	}
	f, err := ratelimitheaderstest.Parse(hdr)
	require.NoError(t, err)
	require.Len(t, f.RateLimit, 1, "one limit, listed once at its lowest remaining")
	assert.Equal(t, map[string]int64{"r": 0, "t": 1}, f.RateLimit[0].Params)
	var p map[string]any
	require.NoError(t, json.Unmarshal(resp.RawBody, &p))
	assert.Equal(t, problem.QuotaExceeded, p["type"])
	assert.Equal(t, []any{"free-tier/per_second"}, p["violated-policies"])
	assert.Equal(t, "/rls", p["instance"], "raw_body names the instance as the HTTP 429 does")

	// A descriptor no policy applies to is OK with no current limit.
	resp, err = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge",
		Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{rlsDescriptor("remote_address", "192.0.2.1", "route", "/none")}})
	require.NoError(t, err)
	assert.Equal(t, rlsv3.RateLimitResponse_OK, resp.OverallCode)
	assert.Nil(t, resp.Statuses[0].CurrentLimit)
}

func TestEnvoyRateLimitServiceBadInput(t *testing.T) {
	n := startEdgeNode(t, "")
	c := rlsClient(t, n)
	cases := map[string]*rlsv3.RateLimitRequest{
		"no domain":      {Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{rlsDescriptor("tenant", "a")}},
		"no descriptors": {Domain: "edge"},
		"unknown key":    {Domain: "edge", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{rlsDescriptor("tenant", "a", "user_id", "u")}},
		"key twice":      {Domain: "edge", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{rlsDescriptor("ip", "192.0.2.1", "remote_address", "192.0.2.2")}},
		"empty identity": {Domain: "edge", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{rlsDescriptor("route", "/rls")}},
		"negative hits":  {Domain: "edge", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{{Entries: rlsDescriptor("tenant", "a").Entries, IsNegativeHits: true}}},
		"huge hits":      {Domain: "edge", HitsAddend: 2_000_000, Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{rlsDescriptor("tenant", "a")}},
	}
	for name, req := range cases {
		_, err := c.ShouldRateLimit(context.Background(), req)
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%s: %v", name, err)
	}
	// A bad second descriptor fails the call before the first is counted.
	_, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 10, Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{
		rlsDescriptor("tenant", "org_b", "route", "/rls"), rlsDescriptor("bogus", "x")}})
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), "descriptors[1]"), err.Error())
	resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 10,
		Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{rlsDescriptor("tenant", "org_b", "route", "/rls")}})
	require.NoError(t, err)
	assert.Equal(t, rlsv3.RateLimitResponse_OK, resp.OverallCode, "nothing was counted by the failed call")
}
