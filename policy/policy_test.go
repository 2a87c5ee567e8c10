package policy

import (
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const sample = `
tenants: {org_acme: pro}
default_tier: free
costs: {"POST /v1/transfers": 10, "/v1/transfers": 3, "GET /users": 1, "/v1/exports/*": 25, "POST /v1/*": 7}
policies:
  - id: free-tier
    match: {tier: free}
    per: [tenant]
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 5, period: 1s, burst: 10}
  - id: ip
    per: [ip]
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 100, period: 1s}
  - id: acme-export
    match: {tenant: org_acme, route: "/v1/exports/*"}
    per: [tenant, route]
    limits:
      - {name: per_hour, algorithm: token_bucket, limit: 10, period: 1h}
  - id: office
    match: {ip: 10.1.0.0/16}
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 1000, period: 1s}
`

func load(t *testing.T, s string) *Set {
	t.Helper()
	set, err := Load("test.yaml", []byte(s))
	require.NoError(t, err)
	return set
}

func ids(ps []*Compiled) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.ID)
	}
	return out
}

func TestMatchAppliesEveryMatchingPolicyInFileOrder(t *testing.T) {
	set := load(t, sample)
	cases := []struct {
		name string
		req  Request
		want []string
	}{
		{"free tenant", Request{Tenant: "org_x", Route: "/a"}, []string{"free-tier", "ip"}},
		{"pro tenant is not free", Request{Tenant: "org_acme", Route: "/a"}, []string{"ip"}},
		{"request tier wins over tenant's", Request{Tenant: "org_acme", Tier: "free"}, []string{"free-tier", "ip"}},
		{"route glob crosses slashes", Request{Tenant: "org_acme", Route: "/v1/exports/a/b"}, []string{"ip", "acme-export"}},
		{"ip in CIDR", Request{Tenant: "org_acme", IP: netip.MustParseAddr("10.1.2.3")}, []string{"ip", "office"}},
		{"ip outside CIDR", Request{Tenant: "org_acme", IP: netip.MustParseAddr("10.2.2.3")}, []string{"ip"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := set.Match(&c.req, set.Tier(&c.req), nil)
			assert.Equal(t, c.want, ids(got))
		})
	}
}

func TestCost(t *testing.T) {
	set := load(t, sample)
	cases := []struct {
		method, route string
		own, want     int64
	}{
		{"POST", "/v1/transfers", 0, 10}, // exact method+path wins
		{"GET", "/v1/transfers", 0, 3},   // exact path, any method
		{"", "/v1/transfers", 0, 3},
		{"GET", "/v1/exports/x", 0, 25}, // longest glob first
		{"POST", "/v1/other", 0, 7},     // method-specific glob
		{"GET", "/v1/other", 0, 1},      // no match: 1
		{"POST", "/v1/transfers", 4, 4}, // the request's own cost wins
	}
	for _, c := range cases {
		r := Request{Method: c.method, Route: c.route, Cost: c.own}
		assert.Equal(t, c.want, set.Cost(&r), "%s %s cost %d", c.method, c.route, c.own)
	}
}

func TestKeysAreHashTaggedAndEscaped(t *testing.T) {
	set := load(t, sample)
	r := Request{Tenant: "org_acme", Route: "/v1/exports/{x},y=z"}
	ps := set.Match(&r, set.Tier(&r), nil)
	require.Equal(t, "acme-export", ps[1].ID)
	subject := ps[1].Subject(&r, "pro")
	assert.Equal(t, "tenant=org_acme,route=/v1/exports/%7Bx%7D%2Cy%3Dz", subject)
	assert.Equal(t, "rl:{"+subject+"}:acme-export:per_hour", ps[1].Limits[0].Key(subject))
	assert.NotContains(t, subject, "}")
	// A missing per value keys the shared "unidentified" counter, so
	// omitting a field cannot dodge a limit.
	r2 := Request{Client: "u1"}
	assert.Equal(t, "ip=", ps[0].Subject(&r2, "free"))
}

func TestValidateListsEveryProblem(t *testing.T) {
	bad := `
costs: {"nope": 0}
policies:
  - id: a
    per: [tenant, bogus]
    limits:
      - {name: s, algorithm: leaky, limit: 0, period: 0s, burst: -1}
      - {name: s, algorithm: token_bucket, limit: 1, period: 1s}
    precision: approximate
    mode: loud
  - id: a
    match: {ip: 300.1.1.1}
    limits: []
`
	_, err := Load("bad.yaml", []byte(bad))
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	msg := err.Error()
	for _, want := range []string{
		"bad.yaml", `costs: "nope"`, `policy "a": per[1]: unknown field "bogus"`,
		`limits[0].algorithm`, `limits[0].limit`, `limits[0].period`, `limits[0].burst`,
		`limits[1].name: duplicate`, `precision: "approximate"`, `mode: "loud"`,
		`id: duplicate id`, `match.ip`, `limits: at least one limit`,
	} {
		assert.Contains(t, msg, want)
	}
	assert.GreaterOrEqual(t, len(ve.Problems), 13)
}

func TestParseRejectsUnknownFieldsWithFileAndLine(t *testing.T) {
	_, err := Load("p.yaml", []byte("policies:\n  - id: a\n    limitz: []\n"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "p.yaml")
	assert.Contains(t, err.Error(), "limitz")
	_, err = Load("p.yaml", []byte("policies:\n  - id: a\n    limits:\n      - {name: x, algorithm: token_bucket, limit: 1, period: soon}\n"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "period")
}

func TestJSONIsAccepted(t *testing.T) {
	set := load(t, `{"policies":[{"id":"j","per":["client"],"limits":[{"name":"s","algorithm":"token_bucket","limit":2,"period":"1s"}]}]}`)
	assert.Equal(t, 1, set.Len())
}

func TestExampleFileLoads(t *testing.T) {
	data, err := os.ReadFile("../examples/policies.yaml")
	require.NoError(t, err)
	set, err := Load("examples/policies.yaml", data)
	require.NoError(t, err)
	assert.Greater(t, set.Len(), 3)
}

func TestGlob(t *testing.T) {
	cases := []struct {
		pattern, s string
		want       bool
	}{
		{"/v1/*", "/v1/a/b", true}, {"/v1/*", "/v2/a", false}, {"*", "", true},
		{"/a/*/c", "/a/b/c", true}, {"/a/*/c", "/a/b/d", false}, {"/x", "/x", true},
		{"/x", "/xy", false}, {"*a*a", "aa", true}, {"*a*a", "a", false},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, glob(c.pattern).match(c.s), "%q ~ %q", c.pattern, c.s)
	}
}

func FuzzLoad(f *testing.F) {
	f.Add([]byte(sample))
	f.Add([]byte(`{"policies":[{"id":"j","limits":[{"name":"s","algorithm":"token_bucket","limit":2,"period":"1s"}]}]}`))
	f.Add([]byte("policies: [{id: x, match: {ip: '::1'}, limits: [{name: a, algorithm: token_bucket, limit: 1, period: 1ms}]}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		set, err := Load("fuzz", data)
		if err != nil {
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatal("empty error message")
			}
			return
		}
		// A set that compiled must be usable on any request.
		r := Request{Tenant: "t", Client: "c", Route: "/r", Method: "GET", IP: netip.MustParseAddr("10.0.0.1")}
		for _, p := range set.Match(&r, set.Tier(&r), nil) {
			subject := p.Subject(&r, set.Tier(&r))
			for _, l := range p.Limits {
				if l.Spec.Rate() <= 0 || l.Spec.Capacity() <= 0 || !strings.HasPrefix(l.Key(subject), "rl:{") {
					t.Fatalf("compiled an unusable limit %+v", l)
				}
			}
		}
		_ = set.Cost(&r)
	})
}
