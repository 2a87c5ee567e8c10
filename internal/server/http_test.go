package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/memstore"
	"github.com/allot-dev/allot/internal/server"
	"github.com/allot-dev/allot/policy"
	"github.com/allot-dev/allot/problem"
	"github.com/allot-dev/allot/ratelimitheaders/ratelimitheaderstest"
)

const httpPolicies = `
default_tier: free
costs: {"POST /v1/transfers": 10}
policies:
  - id: free-tier
    match: {tier: free}
    per: [tenant]
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 5, period: 1s, burst: 10}
      - {name: per_day, algorithm: token_bucket, limit: 1000, period: 24h}
`

// frozen is a clock that never moves, so no bucket refills between checks
// and every number in an answer is exact.
func frozen() time.Time { return time.Unix(1_700_000_000, 0) }

func newDecider(t testing.TB, store decide.Store) *decide.Decider {
	t.Helper()
	set, err := policy.Load("test.yaml", []byte(httpPolicies))
	require.NoError(t, err)
	if store == nil {
		store = memstore.New(frozen)
	}
	return decide.New(decide.Config{Store: store, Policies: set})
}

// startHTTP serves the HTTP face on a real listener.
func startHTTP(t *testing.T, store decide.Store, opts server.HTTPOptions) string {
	t.Helper()
	srv := httptest.NewServer(server.NewHTTP(newDecider(t, store), opts))
	t.Cleanup(srv.Close)
	return srv.URL
}

func post(t *testing.T, url, contentType, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post(url+"/v1/check", contentType, strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

type problemDoc struct {
	Type              string   `json:"type"`
	Title             string   `json:"title"`
	Status            int      `json:"status"`
	Detail            string   `json:"detail"`
	Instance          string   `json:"instance"`
	RetryAfterSeconds *int64   `json:"retry_after_seconds"`
	ViolatedPolicies  []string `json:"violated-policies"`
	Field             string   `json:"field"`
}

func decodeProblem(t *testing.T, resp *http.Response, body []byte) problemDoc {
	t.Helper()
	assert.Equal(t, problem.ContentType, resp.Header.Get("Content-Type"))
	var p problemDoc
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&p), "%s", body)
	return p
}

func TestHTTPCheckAllowedThenThrottled(t *testing.T) {
	url := startHTTP(t, nil, server.HTTPOptions{})

	// Allowed, proto field names: 4 of 10 burst tokens, 4 of 1000 daily.
	resp, body := post(t, url, "application/json", `{"tenant_id":"org_free","client_identifier":"usr_1","route":"/v1/orders","method":"GET","token_cost":4}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	assert.Equal(t, "10", resp.Header.Get("X-RateLimit-Limit"))
	assert.Equal(t, "6", resp.Header.Get("X-RateLimit-Remaining"))
	assert.Equal(t, "1", resp.Header.Get("X-RateLimit-Reset")) // 4 tokens at 5/s: 0.8s, rounded up
	assert.Empty(t, resp.Header.Values("Retry-After"))
	assert.Empty(t, resp.Header.Values("X-RateLimit-Status"))
	f, err := ratelimitheaderstest.Parse(resp.Header)
	require.NoError(t, err)
	assert.Equal(t, []ratelimitheaderstest.Item{
		{Name: "free-tier/per_second", Params: map[string]int64{"q": 5, "w": 1}, Keys: []string{"q", "w"}}, // 5/s, burst 10: q is the quota
		{Name: "free-tier/per_day", Params: map[string]int64{"q": 1000, "w": 86400}, Keys: []string{"q", "w"}},
	}, f.Policy)
	assert.Equal(t, []ratelimitheaderstest.Item{
		{Name: "free-tier/per_second", Params: map[string]int64{"r": 6, "t": 1}, Keys: []string{"r", "t"}},
		{Name: "free-tier/per_day", Params: map[string]int64{"r": 996, "t": 346}, Keys: []string{"r", "t"}}, // 4 x 86.4s
	}, f.RateLimit)
	var ok struct {
		Decision  string `json:"decision"`
		Limit     int64  `json:"limit"`
		Remaining int64  `json:"remaining"`
		PolicyID  string `json:"policy_id"`
		Statuses  []struct {
			LimitName string `json:"limit_name"`
			Remaining int64  `json:"remaining"`
		} `json:"statuses"`
	}
	require.NoError(t, json.Unmarshal(body, &ok))
	assert.Equal(t, "ALLOWED", ok.Decision)
	assert.Equal(t, int64(10), ok.Limit)
	assert.Equal(t, int64(6), ok.Remaining)
	assert.Equal(t, "free-tier", ok.PolicyID)
	require.Len(t, ok.Statuses, 2)

	// Throttled, lowerCamelCase names: 7 > the 6 left.
	resp, body = post(t, url, "application/json; charset=utf-8", `{"tenantId":"org_free","clientIdentifier":"usr_1","route":"/v1/orders","tokenCost":7}`)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", body)
	assert.Equal(t, "1", resp.Header.Get("Retry-After")) // 1 token at 5/s: 0.2s, rounded up
	assert.Equal(t, "10", resp.Header.Get("X-RateLimit-Limit"))
	assert.Equal(t, "6", resp.Header.Get("X-RateLimit-Remaining"))
	assert.Equal(t, "1", resp.Header.Get("X-RateLimit-Reset"))
	f, err = ratelimitheaderstest.Parse(resp.Header)
	require.NoError(t, err)
	require.Len(t, f.RateLimit, 2)
	assert.Equal(t, map[string]int64{"r": 6, "t": 1}, f.RateLimit[0].Params)
	assert.Equal(t, map[string]int64{"r": 996, "t": 346}, f.RateLimit[1].Params)
	require.Len(t, f.Policy, 2)
	p := decodeProblem(t, resp, body)
	assert.Equal(t, problem.QuotaExceeded, p.Type)
	assert.Equal(t, "Rate limit exceeded", p.Title)
	assert.Equal(t, 429, p.Status)
	assert.Equal(t, "/v1/orders", p.Instance)
	assert.Contains(t, p.Detail, "free-tier")
	assert.Contains(t, p.Detail, "per_second")
	require.NotNil(t, p.RetryAfterSeconds)
	assert.Equal(t, int64(1), *p.RetryAfterSeconds)
	assert.Equal(t, []string{"free-tier/per_second"}, p.ViolatedPolicies)
}

func TestHTTPCheckCostAboveCapacityHasNoRetryAfter(t *testing.T) {
	url := startHTTP(t, nil, server.HTTPOptions{})
	resp, body := post(t, url, "", `{"tenant_id":"org_big","token_cost":11}`)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", body)
	// Retrying never helps, so no Retry-After and no effective window.
	assert.Empty(t, resp.Header.Values("Retry-After"))
	f, err := ratelimitheaderstest.Parse(resp.Header)
	require.NoError(t, err)
	assert.Equal(t, []string{"r"}, f.RateLimit[0].Keys)
	p := decodeProblem(t, resp, body)
	assert.Nil(t, p.RetryAfterSeconds)
	assert.Contains(t, p.Detail, "exceeds its capacity")
}

func TestHTTPCheckNoPolicyMatchedHasNoQuotaFields(t *testing.T) {
	url := startHTTP(t, nil, server.HTTPOptions{})
	resp, body := post(t, url, "application/json", `{"tenant_id":"org_x","tier":"gold"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	for _, h := range []string{"X-RateLimit-Limit", "RateLimit-Policy", "RateLimit", "Retry-After", "X-RateLimit-Status"} {
		assert.Empty(t, resp.Header.Values(h), h)
	}
}

type downStore struct{}

func (downStore) Take(context.Context, []algorithm.Group) ([]algorithm.Result, error) {
	return nil, errors.New("redis: connection refused")
}
func (downStore) Refund(context.Context, []algorithm.Group) error { return nil }

func TestHTTPCheckFailedOpenIsBypass(t *testing.T) {
	events := make(chan server.Event, 1)
	url := startHTTP(t, downStore{}, server.HTTPOptions{Observe: func(_ context.Context, ev server.Event) { events <- ev }})
	resp, body := post(t, url, "application/json", `{"tenant_id":"org_free"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	assert.Equal(t, "Bypass", resp.Header.Get("X-RateLimit-Status"))
	assert.Empty(t, resp.Header.Values("X-RateLimit-Limit"))
	assert.Contains(t, string(body), `"decision":"FAILED_OPEN"`)
	assert.Contains(t, string(body), `"degraded":true`, "decided without the store")
	ev := <-events
	require.NoError(t, ev.Err)
	assert.Equal(t, "http", ev.Face)
	assert.Equal(t, decide.FailedOpen, ev.Decision.Outcome)
}

func TestHTTPCheckBadInput(t *testing.T) {
	url := startHTTP(t, nil, server.HTTPOptions{})
	cases := []struct {
		name, contentType, body string
		status                  int
		field                   string
	}{
		{"empty body", "application/json", ``, 400, ""},
		{"not json", "application/json", `tenant_id=x`, 400, ""},
		{"unknown field", "application/json", `{"tenant":"x"}`, 400, ""},
		{"cost beyond int32", "application/json", `{"tenant_id":"x","token_cost":4294967296}`, 400, ""},
		{"negative cost", "application/json", `{"tenant_id":"x","token_cost":-1}`, 400, "token_cost"},
		{"empty identity", "application/json", `{"route":"/x"}`, 400, "tenant_id"},
		{"bad ip", "application/json", `{"ip":"999.1.1.1"}`, 400, "ip"},
		{"long tenant", "application/json", `{"tenant_id":"` + strings.Repeat("a", 257) + `"}`, 400, "tenant_id"},
		{"too big", "application/json", `{"tenant_id":"` + strings.Repeat("a", server.MaxBodyBytes) + `"}`, 413, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, body := post(t, url, c.contentType, c.body)
			require.Equal(t, c.status, resp.StatusCode, "%s", body)
			p := decodeProblem(t, resp, body)
			assert.Equal(t, c.status, p.Status)
			assert.Equal(t, problem.Blank, p.Type)
			assert.NotEmpty(t, p.Detail)
			assert.Equal(t, c.field, p.Field)
			assert.Empty(t, resp.Header.Values("X-RateLimit-Limit"))
		})
	}
	resp, err := http.Get(url + "/v1/check")
	require.NoError(t, err)
	var p405 problem.Details
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&p405))
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.Equal(t, "POST", resp.Header.Get("Allow"))
	assert.Equal(t, "/v1/check", p405.Instance)
}

func TestHTTPHealthAndReadiness(t *testing.T) {
	ready := true
	url := startHTTP(t, nil, server.HTTPOptions{Ready: func() bool { return ready }})
	get := func(path string) int {
		resp, err := http.Get(url + path)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, 200, get("/healthz"))
	assert.Equal(t, 200, get("/readyz"))
	ready = false
	assert.Equal(t, 503, get("/readyz"))
	assert.Equal(t, 200, get("/healthz"))
}

// FuzzHTTPCheckBody: no body makes the handler panic, and every answer is
// a decision (200, 429) or a 400 problem document.
func FuzzHTTPCheckBody(f *testing.F) {
	for _, s := range []string{
		`{"tenant_id":"org_free","token_cost":4}`, `{"tenantId":"a","tokenCost":"3"}`, `{"ip":"10.0.0.1","route":"/v1/transfers","method":"post"}`,
		`{"tenant_id":"a","token_cost":1e3}`, `{"tenant_id":"\u0000"}`, `[]`, `null`, `{"tenant_id":null}`, `{"tier":"free","client_identifier":"c"}`,
	} {
		f.Add([]byte(s))
	}
	h := server.NewHTTP(newDecider(f, nil), server.HTTPOptions{})
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest(http.MethodPost, "/v1/check", strings.NewReader(string(body)))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK, http.StatusTooManyRequests:
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			var p problemDoc
			if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Status != rec.Code || rec.Header().Get("Content-Type") != problem.ContentType {
				t.Fatalf("bad problem answer %d %q: %v", rec.Code, rec.Body.String(), err)
			}
		default:
			t.Fatalf("status %d for %q: %s", rec.Code, body, rec.Body.String())
		}
	})
}
