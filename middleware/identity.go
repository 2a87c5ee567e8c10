package middleware

import (
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/http"
	"net/netip"
	"path"
	"strings"

	"github.com/allot-dev/allot/policy"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// Identity says where a request's identity comes from. Every header is
// optional; an unset name is not read.
//
//   - tenant_id is the value of TenantHeader.
//   - client_identifier is APIKeyID of the APIKeyHeader value when that is
//     present, else the UserHeader value.
//   - ip is the client address (ClientIP with TrustedProxies).
//   - route and method are the request's path and method, so the policy
//     file's costs apply. The path is cleaned as net/http's ServeMux
//     cleans it (routePath): "//v1/./x" counts as "/v1/x", as an upstream
//     that cleans paths serves it, so another spelling of a route is not
//     another counter or a way around a route's policy.
//
// Only read identity headers that your own gateway sets or authenticates:
// a header the caller controls lets it choose its own counter.
type Identity struct {
	APIKeyHeader   string // e.g. X-API-Key
	UserHeader     string // e.g. X-User-ID
	TenantHeader   string // e.g. X-Tenant-ID
	TrustedProxies []netip.Prefix
}

// Request is the check for r.
func (id *Identity) Request(r *http.Request) *ratelimitv1.RateLimitRequest {
	in := &ratelimitv1.RateLimitRequest{Route: routePath(r.URL.Path), Method: r.Method}
	if id.TenantHeader != "" {
		in.TenantId = r.Header.Get(id.TenantHeader)
	}
	if id.APIKeyHeader != "" {
		if k := r.Header.Get(id.APIKeyHeader); k != "" {
			in.ClientIdentifier = APIKeyID(k)
		}
	}
	if in.ClientIdentifier == "" && id.UserHeader != "" {
		in.ClientIdentifier = r.Header.Get(id.UserHeader)
	}
	if ip := ClientIP(r, id.TrustedProxies); ip.IsValid() {
		in.Ip = ip.String()
	}
	return in
}

// routePath is a rooted path p with repeated slashes and dot segments
// resolved and its trailing slash kept, as net/http's ServeMux cleans
// paths; anything else (empty, "*") as it is.
func routePath(p string) string {
	if p == "" || p[0] != '/' {
		return p
	}
	c := path.Clean(p)
	if p[len(p)-1] == '/' && c != "/" {
		c += "/"
	}
	return c
}

// APIKeyID is the client identifier of an API key: "key_" and the first
// 128 bits of its SHA-256, in hex. Keys are secrets and identifiers end up
// in Redis key names and logs; the digest keeps them out while one key
// still maps to one counter.
func APIKeyID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "key_" + hex.EncodeToString(sum[:16])
}

// ClientIP is the address of the client that sent r. It is the TCP peer
// unless the peer is a trusted proxy; then X-Forwarded-For is read from
// right to left, skipping trusted proxies, and the first untrusted address
// is the client. Entries left of that one were written by the client and
// are never believed. If every entry is trusted, the leftmost is the
// client; an entry that is not an address ends the walk at the last
// trusted hop, the nearest party we can vouch for. It returns the zero
// Addr when the peer address cannot be parsed.
func ClientIP(r *http.Request, trusted []netip.Prefix) netip.Addr {
	peer := parseAddr(r.RemoteAddr)
	if !peer.IsValid() || !contains(trusted, peer) {
		return peer
	}
	hops := forwardedFor(r.Header.Values("X-Forwarded-For"))
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a := parseAddr(hops[i])
		if !a.IsValid() {
			return client
		}
		client = a
		if !contains(trusted, a) {
			return a
		}
	}
	return client
}

// forwardedFor splits X-Forwarded-For field lines, in order, into hops.
func forwardedFor(lines []string) []string {
	var hops []string
	for _, line := range lines {
		for h := range strings.SplitSeq(line, ",") {
			hops = append(hops, strings.TrimSpace(h))
		}
	}
	return hops
}

// parseAddr reads "addr", "addr:port" or "[addr]:port" in the canonical
// form of policy.ParseIP (no zone, IPv4 unmapped).
func parseAddr(s string) netip.Addr {
	if a, err := policy.ParseIP(s); err == nil {
		return a
	}
	if host, _, err := net.SplitHostPort(s); err == nil {
		if a, err := policy.ParseIP(host); err == nil {
			return a
		}
	}
	return netip.Addr{}
}

func contains(prefixes []netip.Prefix, a netip.Addr) bool {
	for _, p := range prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ParsePrefixes parses a comma-separated list of CIDRs or addresses (a
// bare address is a /32 or /128), for flags such as --trusted-proxies.
func ParsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		if !strings.Contains(f, "/") {
			a, err := netip.ParseAddr(f)
			if err != nil {
				return nil, err
			}
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, err
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
