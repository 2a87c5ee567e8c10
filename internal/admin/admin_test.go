package admin_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/admin"
	"github.com/allot-dev/allot/internal/policystore"
	"github.com/allot-dev/allot/policy"
)

const token = "s3cret"

const goodPolicy = `{"id":"free-tier","match":{"tier":"free"},"per":["tenant"],
 "limits":[{"name":"per_second","algorithm":"token_bucket","limit":5,"period":"1s","burst":10}]}`

func serve(t *testing.T) (*httptest.Server, policystore.Source) {
	t.Helper()
	store := policystore.NewMemory()
	srv := httptest.NewServer(admin.New(admin.Config{Store: store, Token: token}))
	t.Cleanup(srv.Close)
	return srv, store
}

func call(t *testing.T, srv *httptest.Server, method, path, tok, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(data)
}

func problemOf(t *testing.T, resp *http.Response, body string) admin.Problem {
	t.Helper()
	assert.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
	var p admin.Problem
	require.NoError(t, json.Unmarshal([]byte(body), &p), body)
	assert.Equal(t, resp.StatusCode, p.Status)
	assert.NotEmpty(t, p.Type)
	assert.NotEmpty(t, p.Title)
	assert.NotEmpty(t, p.Instance)
	return p
}

func TestCRUDWithVersions(t *testing.T) {
	srv, _ := serve(t)
	resp, body := call(t, srv, "POST", "/v1/policies", token, goodPolicy)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	assert.Equal(t, "/v1/policies/free-tier", resp.Header.Get("Location"))
	assert.Equal(t, `"1"`, resp.Header.Get("ETag"))

	resp, body = call(t, srv, "POST", "/v1/policies", token, goodPolicy)
	require.Equal(t, http.StatusConflict, resp.StatusCode)
	assert.Contains(t, problemOf(t, resp, body).Detail, "already exists")

	resp, body = call(t, srv, "GET", "/v1/policies/free-tier", "", "")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var p policy.Policy
	require.NoError(t, json.Unmarshal([]byte(body), &p))
	assert.Equal(t, int64(1), p.Version)
	assert.Contains(t, body, `"period": "1s"`)

	// PUT with a stale If-Match conflicts; with the current one it writes.
	changed := strings.Replace(goodPolicy, `"limit":5`, `"limit":6`, 1)
	resp, body = call(t, srv, "PUT", "/v1/policies/free-tier", token, changed, "If-Match", `"7"`)
	require.Equal(t, http.StatusConflict, resp.StatusCode, body)
	resp, body = call(t, srv, "PUT", "/v1/policies/free-tier", token, changed, "If-Match", `"1"`)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, `"2"`, resp.Header.Get("ETag"))

	resp, body = call(t, srv, "GET", "/v1/policies", "", "")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var list admin.PolicyList
	require.NoError(t, json.Unmarshal([]byte(body), &list))
	require.Len(t, list.Policies, 1)
	assert.Equal(t, int64(6), list.Policies[0].Limits[0].Limit)

	resp, _ = call(t, srv, "DELETE", "/v1/policies/free-tier", token, "")
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	resp, body = call(t, srv, "GET", "/v1/policies/free-tier", "", "")
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	problemOf(t, resp, body)

	resp, body = call(t, srv, "GET", "/v1/policies/free-tier/history", "", "")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var h admin.History
	require.NoError(t, json.Unmarshal([]byte(body), &h))
	require.Len(t, h.Versions, 3)
	assert.True(t, h.Versions[0].Deleted)
	assert.Equal(t, int64(5), h.Versions[2].Policy.Limits[0].Limit)
}

func TestWritesNeedTheToken(t *testing.T) {
	srv, store := serve(t)
	for _, tok := range []string{"", "wrong", token + "x"} {
		for _, c := range []struct{ method, path string }{
			{"POST", "/v1/policies"}, {"PUT", "/v1/policies/free-tier"}, {"DELETE", "/v1/policies/free-tier"}, {"PUT", "/v1/settings"},
			{"POST", "/v1/policies:validate"}, {"POST", "/v1/validate"},
		} {
			resp, body := call(t, srv, c.method, c.path, tok, goodPolicy)
			require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%s %s with %q", c.method, c.path, tok)
			assert.Contains(t, resp.Header.Get("WWW-Authenticate"), "Bearer")
			problemOf(t, resp, body)
		}
	}
	ps, err := store.List(context.Background())
	require.NoError(t, err)
	assert.Empty(t, ps)
	// Reads are open; dry runs cost what writes cost, so they are not.
	resp, _ := call(t, srv, "GET", "/v1/policies", "", "")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	resp, _ = call(t, srv, "POST", "/v1/policies:validate", token, goodPolicy)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

// blockingStore's Load waits for release, so a request can be held
// inside the handler (holding its slot) for as long as a test needs.
type blockingStore struct {
	policystore.Source
	entered chan struct{}
	release chan struct{}
}

func (b *blockingStore) Load(ctx context.Context) (*policy.File, policystore.Rev, error) {
	b.entered <- struct{}{}
	<-b.release
	return b.Source.Load(ctx)
}

// Writes and dry runs in progress are bounded: past MaxConcurrent a
// request waits, then is answered 503 rather than piling up decodes.
func TestWritesAndDryRunsAreBounded(t *testing.T) {
	store := &blockingStore{Source: policystore.NewMemory(), entered: make(chan struct{}), release: make(chan struct{})}
	srv := httptest.NewServer(admin.New(admin.Config{Store: store, Token: token, MaxConcurrent: 1, BusyWait: 50 * time.Millisecond}))
	t.Cleanup(srv.Close)
	first := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/policies:validate", strings.NewReader(goodPolicy))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := srv.Client().Do(req)
		if err != nil {
			first <- 0
			return
		}
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	<-store.entered // the first dry run holds the only slot
	resp, body := call(t, srv, "POST", "/v1/policies:validate", token, goodPolicy)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, body)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	problemOf(t, resp, body)

	store.release <- struct{}{}
	assert.Equal(t, http.StatusOK, <-first)
	go func() { <-store.entered; store.release <- struct{}{} }()
	resp, body = call(t, srv, "POST", "/v1/policies:validate", token, goodPolicy)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the slot is free again: %s", body)
}

func TestInvalidWritesListEveryProblem(t *testing.T) {
	srv, store := serve(t)
	bad := `{"id":"x","per":["tenant","bogus"],"mode":"loud",
	 "limits":[{"name":"s","algorithm":"leaky","limit":0,"period":"0s"},{"name":"s","algorithm":"token_bucket","limit":1,"period":"1s"}]}`
	resp, body := call(t, srv, "POST", "/v1/policies", token, bad)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
	p := problemOf(t, resp, body)
	assert.Equal(t, admin.TypeInvalid, p.Type)
	fields := map[string]bool{}
	for _, e := range p.Errors {
		assert.Equal(t, "x", e.Policy)
		assert.NotEmpty(t, e.Message)
		fields[e.Field] = true
	}
	for _, f := range []string{"per[1]", "mode", "limits[0].algorithm", "limits[0].limit", "limits[0].period", "limits[1].name"} {
		assert.True(t, fields[f], "missing %s in %s", f, body)
	}
	ps, _ := store.List(context.Background())
	assert.Empty(t, ps, "nothing stored")

	// The same through the dry run, which writes nothing either.
	resp, body = call(t, srv, "POST", "/v1/validate", token, bad)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Len(t, problemOf(t, resp, body).Errors, len(p.Errors))
}

func TestWriteIsValidatedAgainstTheWholeSet(t *testing.T) {
	srv, store := serve(t)
	ctx := context.Background()
	// A bad policy already in the store (written around the API).
	_, err := store.Put(ctx, policy.Policy{ID: "legacy"}, policystore.NotExist)
	require.NoError(t, err)
	resp, body := call(t, srv, "POST", "/v1/policies", token, goodPolicy)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
	p := problemOf(t, resp, body)
	require.Len(t, p.Errors, 1)
	assert.Equal(t, "legacy", p.Errors[0].Policy)
	// Fixing the bad one is allowed, and then the other write is.
	fixed := strings.Replace(goodPolicy, "free-tier", "legacy", 1)
	resp, body = call(t, srv, "PUT", "/v1/policies/legacy", token, fixed)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	resp, body = call(t, srv, "POST", "/v1/policies", token, goodPolicy)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)

	// Settings too: a cost of 0 is invalid.
	resp, body = call(t, srv, "PUT", "/v1/settings", token, `{"costs":{"POST /x":0},"default_tier":"free"}`)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
	assert.Equal(t, "costs", problemOf(t, resp, body).Errors[0].Field)
	resp, body = call(t, srv, "PUT", "/v1/settings", token, `{"costs":{"POST /x":3},"default_tier":"free"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	resp, body = call(t, srv, "GET", "/v1/settings", "", "")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, `"default_tier": "free"`)
}

func TestBodiesAreDecodedStrictly(t *testing.T) {
	srv, _ := serve(t)
	cases := []struct{ name, body, field string }{
		{"unknown field", `{"id":"a","limitz":[]}`, "limitz"},
		{"bad duration", `{"id":"a","limits":[{"name":"s","algorithm":"token_bucket","limit":1,"period":"soon"}]}`, ""},
		{"numeric duration", `{"id":"a","limits":[{"name":"s","algorithm":"token_bucket","limit":1,"period":1000}]}`, ""},
		{"wrong type", `{"id":7}`, "id"},
		{"not JSON", `id: a`, ""},
		{"trailing data", `{"id":"a"} {}`, ""},
		{"empty", ``, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, body := call(t, srv, "POST", "/v1/policies", token, c.body)
			require.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
			p := problemOf(t, resp, body)
			require.Len(t, p.Errors, 1)
			if c.field != "" {
				assert.Equal(t, c.field, p.Errors[0].Field)
			}
		})
	}
	t.Run("too large", func(t *testing.T) {
		big := `{"id":"a","match":{"route":"` + strings.Repeat("x", admin.MaxPolicyBody) + `"}}`
		resp, body := call(t, srv, "POST", "/v1/policies", token, big)
		require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
		problemOf(t, resp, body)
	})
	t.Run("not json content type", func(t *testing.T) {
		resp, _ := call(t, srv, "POST", "/v1/policies", token, goodPolicy, "Content-Type", "text/yaml")
		require.Equal(t, http.StatusUnsupportedMediaType, resp.StatusCode)
	})
	t.Run("path and body disagree", func(t *testing.T) {
		resp, body := call(t, srv, "PUT", "/v1/policies/other", token, goodPolicy)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Equal(t, "id", problemOf(t, resp, body).Errors[0].Field)
	})
}

func TestValidateAWholeFile(t *testing.T) {
	srv, _ := serve(t)
	file := `{"default_tier":"free","policies":[` + goodPolicy + `,` + strings.Replace(goodPolicy, "free-tier", "b", 1) + `]}`
	resp, body := call(t, srv, "POST", "/v1/policies:validate", token, file)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	var res admin.ValidateResult
	require.NoError(t, json.Unmarshal([]byte(body), &res))
	assert.Equal(t, admin.ValidateResult{Valid: true, Policies: 2}, res)

	dup := `{"policies":[` + goodPolicy + `,` + goodPolicy + `],"costs":{"nope":1}}`
	resp, body = call(t, srv, "POST", "/v1/policies:validate", token, dup)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	p := problemOf(t, resp, body)
	require.Len(t, p.Errors, 1, "an upsert of the same id twice leaves one policy; the bad cost remains")
	assert.Equal(t, "costs", p.Errors[0].Field)
}

func TestUnknownEndpointsAreProblems(t *testing.T) {
	srv, _ := serve(t)
	resp, body := call(t, srv, "GET", "/v2/nothing", "", "")
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	problemOf(t, resp, body)
	resp, _ = call(t, srv, "GET", "/v1/policies/bad%20id", "", "")
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
}

func TestCheckAddr(t *testing.T) {
	assert.NoError(t, admin.CheckAddr("127.0.0.1:9000", ""))
	assert.NoError(t, admin.CheckAddr("[::1]:9000", ""))
	assert.NoError(t, admin.CheckAddr("localhost:9000", ""))
	assert.Error(t, admin.CheckAddr("0.0.0.0:9000", ""))
	assert.Error(t, admin.CheckAddr(":9000", ""))
	assert.Error(t, admin.CheckAddr("10.0.0.1:9000", ""))
	assert.NoError(t, admin.CheckAddr(":9000", "tok"))
	// A token no client can present (presented tokens are trimmed).
	for _, tok := range []string{" ", "\t \n", " tok", "tok "} {
		assert.Error(t, admin.CheckAddr(":9000", tok), "%q", tok)
		assert.Error(t, admin.CheckAddr("127.0.0.1:9000", tok), "%q", tok)
	}
}

func TestClientRoundTrip(t *testing.T) {
	srv, _ := serve(t)
	ctx := context.Background()
	c := admin.NewClient(srv.URL, token, srv.Client())
	var p policy.Policy
	require.NoError(t, json.Unmarshal([]byte(goodPolicy), &p))
	created, err := c.Create(ctx, p)
	require.NoError(t, err)
	assert.Equal(t, int64(1), created.Version)
	p.Limits[0].Limit = 9
	_, err = c.Put(ctx, p, 5)
	var prob *admin.Problem
	require.ErrorAs(t, err, &prob)
	assert.Equal(t, http.StatusConflict, prob.Status)
	updated, err := c.Put(ctx, p, 1)
	require.NoError(t, err)
	assert.Equal(t, int64(2), updated.Version)
	hist, err := c.History(ctx, p.ID)
	require.NoError(t, err)
	assert.Len(t, hist, 2)
	p.Limits[0].Limit = 0
	_, err = c.Validate(ctx, p)
	require.ErrorAs(t, err, &prob)
	assert.Contains(t, prob.Error(), `policy "free-tier": limits[0].limit`)
	noToken := admin.NewClient(srv.URL, "", srv.Client())
	require.ErrorAs(t, noToken.Delete(ctx, p.ID, policystore.AnyVersion), &prob)
	assert.Equal(t, http.StatusUnauthorized, prob.Status)
	require.NoError(t, c.Delete(ctx, p.ID, 2))
}

func TestServeStopsWithItsContext(t *testing.T) {
	srv := admin.New(admin.Config{Store: policystore.NewMemory()})
	lis, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	_, err = admin.NewClient("http://"+lis.Addr().String(), "", nil).List(ctx)
	require.NoError(t, err)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
}

// FuzzDecodeChange: no body makes the decoder panic, and whatever it
// accepts is a change that applies to a set without panicking and
// validates (or not) with messages.
func FuzzDecodeChange(f *testing.F) {
	f.Add([]byte(goodPolicy))
	f.Add([]byte(`{"policies":[` + goodPolicy + `],"tenants":{"a":"pro"},"costs":{"POST /x":2}}`))
	f.Add([]byte(`{"id":"a","limitz":[]}`))
	f.Add([]byte(`{"id":"a","limits":[{"period":"-1s"}]}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		change, touched, prob := admin.DecodeChange(data)
		if prob != nil {
			if prob.Status != http.StatusBadRequest || len(prob.Errors) == 0 || prob.Errors[0].Message == "" {
				t.Fatalf("bad problem for %q: %+v", data, prob)
			}
			return
		}
		f := &policy.File{}
		change(f)
		_ = touched(policy.Problem{})
		if err := policy.Validate("fuzz", f); err != nil && strings.TrimSpace(err.Error()) == "" {
			t.Fatal("empty validation message")
		}
	})
}

// serveOn runs Serve on a loopback listener until the test ends, and
// returns its base URL.
func serveOn(t *testing.T) string {
	t.Helper()
	lis, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- admin.New(admin.Config{Store: policystore.NewMemory(), Token: token}).Serve(ctx, lis) }()
	t.Cleanup(func() { cancel(); assert.NoError(t, <-done) })
	return "http://" + lis.Addr().String()
}

// What a caller can hold before its token is looked at is bounded: a
// request's headers (431 past 64 KiB) and the connections served at
// once (256; more wait until one goes).
func TestServeBoundsWhatCallersHold(t *testing.T) {
	url := serveOn(t)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	get := func(ctx context.Context, pad int) (int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/policies", nil)
		require.NoError(t, err)
		req.Header.Set("X-Pad", strings.Repeat("x", pad))
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	ctx := context.Background()
	code, err := get(ctx, 32<<10)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
	code, err = get(ctx, 100<<10)
	require.NoError(t, err)
	assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, code)

	client.CloseIdleConnections()
	hogs := make([]net.Conn, 256)
	for i := range hogs {
		c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
		require.NoError(t, err)
		defer c.Close()
		hogs[i] = c
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err = get(short, 0)
	require.ErrorIs(t, err, context.DeadlineExceeded, "not served while idle connections hold every slot")
	require.NoError(t, hogs[0].Close())
	long, cancel2 := context.WithTimeout(ctx, 20*time.Second)
	defer cancel2()
	code, err = get(long, 0)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
}
