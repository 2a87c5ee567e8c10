package middleware_test

import (
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/middleware"
)

func TestClientIP(t *testing.T) {
	trusted, err := middleware.ParsePrefixes("10.0.0.0/8, 192.0.2.7, ::ffff:172.16.0.0/108")
	require.NoError(t, err)
	cases := []struct {
		name string
		peer string
		xff  []string
		want string
	}{
		{"untrusted peer: XFF ignored", "203.0.113.9:5000", []string{"1.2.3.4"}, "203.0.113.9"},
		{"trusted peer, no XFF", "10.1.1.1:5000", nil, "10.1.1.1"},
		{"trusted peer: rightmost untrusted wins", "10.1.1.1:5000", []string{"6.6.6.6, 198.51.100.4, 10.2.2.2"}, "198.51.100.4"},
		{"spoofed left entries never believed", "10.1.1.1:5000", []string{"10.9.9.9, 198.51.100.4"}, "198.51.100.4"},
		{"several field lines, in order", "192.0.2.7:1", []string{"6.6.6.6", "198.51.100.4", "10.2.2.2"}, "198.51.100.4"},
		{"every hop trusted: leftmost", "10.1.1.1:5000", []string{"10.3.3.3, 10.2.2.2"}, "10.3.3.3"},
		{"garbage stops at the last trusted hop", "10.1.1.1:5000", []string{"6.6.6.6, nonsense, 10.2.2.2"}, "10.2.2.2"},
		{"ports and brackets", "10.1.1.1:5000", []string{"[2001:db8::1]:443, 10.2.2.2:80"}, "2001:db8::1"},
		{"mapped v4 peer is v4", "[::ffff:10.1.1.1]:5000", []string{"198.51.100.4"}, "198.51.100.4"},
		{"4in6 prefix trusted as v4", "172.16.0.5:1", []string{"198.51.100.4"}, "198.51.100.4"},
		{"unparsable peer", "@", nil, "invalid IP"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = c.peer
			for _, v := range c.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			assert.Equal(t, c.want, middleware.ClientIP(r, trusted).String())
		})
	}
}

func TestParsePrefixes(t *testing.T) {
	got, err := middleware.ParsePrefixes(" 10.0.0.1/8 ,2001:db8::/32,192.0.2.1,")
	require.NoError(t, err)
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32"), netip.MustParsePrefix("192.0.2.1/32")}, got)
	_, err = middleware.ParsePrefixes("10.0.0.0/33")
	assert.Error(t, err)
	_, err = middleware.ParsePrefixes("proxy.internal")
	assert.Error(t, err)
}

func TestIdentityRequest(t *testing.T) {
	id := middleware.Identity{APIKeyHeader: "X-API-Key", UserHeader: "X-User", TenantHeader: "X-Tenant"}
	r := httptest.NewRequest("POST", "/v1/transfers?x=1", nil)
	r.RemoteAddr = "198.51.100.4:1234"
	r.Header.Set("X-Tenant", "org_acme")
	r.Header.Set("X-User", "usr_1")
	in := id.Request(r)
	assert.Equal(t, "org_acme", in.TenantId)
	assert.Equal(t, "usr_1", in.ClientIdentifier)
	assert.Equal(t, "/v1/transfers", in.Route)
	assert.Equal(t, "POST", in.Method)
	assert.Equal(t, "198.51.100.4", in.Ip)
	r.Header.Set("X-API-Key", "sk_live_secret")
	in = id.Request(r)
	assert.Equal(t, middleware.APIKeyID("sk_live_secret"), in.ClientIdentifier)
	assert.Regexp(t, `^key_[0-9a-f]{32}$`, in.ClientIdentifier)
	assert.NotContains(t, in.ClientIdentifier, "secret")
}

// Other spellings of one path are one route: the path is cleaned as an
// upstream that cleans paths (net/http's ServeMux) would serve it.
func TestIdentityRouteIsTheCleanedPath(t *testing.T) {
	id := middleware.Identity{}
	for raw, want := range map[string]string{
		"/v1/transfers":       "/v1/transfers",
		"//v1//transfers":     "/v1/transfers",
		"/v1/./transfers":     "/v1/transfers",
		"/v1/x/../transfers":  "/v1/transfers",
		"/../v1/transfers":    "/v1/transfers",
		"/v1/transfers/":      "/v1/transfers/",
		"/v1/transfers//":     "/v1/transfers/",
		"/v1/%2F%2Ftransfers": "/v1/transfers", // decoded by net/url first
		"/":                   "/",
		"/v1/Transfers":       "/v1/Transfers", // paths are case-sensitive
	} {
		r := httptest.NewRequest("GET", "http://example.com"+raw, nil)
		assert.Equal(t, want, id.Request(r).Route, raw)
	}
}
