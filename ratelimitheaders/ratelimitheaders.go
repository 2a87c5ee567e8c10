// Package ratelimitheaders is the one place that turns a check's answer
// into HTTP response header fields. The node's HTTP check, the net/http
// middleware, the reverse proxy and the Envoy rate limit service all write
// their headers here, so a client sees the same fields whichever face it
// meets.
//
// It writes, for an answer that at least one enforced limit applied to:
//
//	X-RateLimit-Limit      capacity of the deciding limit (the violated one, else the one with the fewest tokens left)
//	X-RateLimit-Remaining  tokens left in it
//	X-RateLimit-Reset      seconds until it is full again (throttled: until the request could pass)
//	Retry-After            throttled only: whole seconds until the request could pass (RFC 9110 delay-seconds)
//	RateLimit-Policy       every applied limit: "<policy>/<limit>";q=<quota per window>;w=<period seconds>
//	RateLimit              every applied limit: "<policy>/<limit>";r=<remaining>;t=<seconds>
//
// RateLimit-Policy and RateLimit follow draft-ietf-httpapi-ratelimit-headers-11
// (pinned: the syntax changed between revisions) and are RFC 9651 Lists
// whose Items are Strings. A fail-open answer carries X-RateLimit-Status:
// Bypass and no quota fields, since no counter was read.
//
// The package reads the wire answer (ratelimitv1.RateLimitResponse) rather
// than decide.Decision so that a node's own answers and a remote
// middleware's answers, which only see the wire form, are byte-identical.
// It does no I/O and keeps no state, and it does not decide: it only
// renders the answer it is given.
package ratelimitheaders

import (
	"net/http"
	"strconv"
	"strings"

	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// Revision is the RateLimit header fields draft these fields follow.
const Revision = "draft-ietf-httpapi-ratelimit-headers-11"

// Field names. net/http canonicalizes them (X-Ratelimit-Limit); field
// names are case-insensitive on the wire.
const (
	XLimit       = "X-RateLimit-Limit"
	XRemaining   = "X-RateLimit-Remaining"
	XReset       = "X-RateLimit-Reset"
	XStatus      = "X-RateLimit-Status"
	RetryAfter   = "Retry-After"
	Policy       = "RateLimit-Policy"
	RateLimit    = "RateLimit"
	StatusBypass = "Bypass" // the X-RateLimit-Status value of a fail-open answer
)

// maxInteger is the largest RFC 9651 Integer (15 decimal digits).
const maxInteger = 999_999_999_999_999

// Set writes the fields for resp into h, replacing any of the same names.
func Set(h http.Header, resp *ratelimitv1.RateLimitResponse) {
	for _, k := range [...]string{XLimit, XRemaining, XReset, XStatus, RetryAfter, Policy, RateLimit} {
		h.Del(k)
	}
	if resp.GetDecision() == ratelimitv1.RateLimitResponse_FAILED_OPEN {
		h.Set(XStatus, StatusBypass)
		return
	}
	if ra, ok := RetryAfterSeconds(resp); ok {
		h.Set(RetryAfter, strconv.FormatInt(ra, 10))
	}
	sts := resp.GetStatuses()
	if len(sts) == 0 {
		// No enforced limit applied (no policy matched, only shadow
		// policies, or a fail-closed store outage): there is no quota to
		// describe, and RateLimit-Policy may not be an empty List.
		return
	}
	h.Set(XLimit, strconv.FormatInt(nonNegative(resp.GetLimit()), 10))
	h.Set(XRemaining, strconv.FormatInt(nonNegative(resp.GetRemaining()), 10))
	h.Set(XReset, strconv.FormatInt(nonNegative(resp.GetResetAfterSeconds()), 10))
	h.Set(Policy, policyList(sts))
	h.Set(RateLimit, limitList(sts, resp))
}

// SetBypass marks h as a fail-open answer made without asking a node.
func SetBypass(h http.Header) {
	Set(h, &ratelimitv1.RateLimitResponse{Decision: ratelimitv1.RateLimitResponse_FAILED_OPEN})
}

// RetryAfterSeconds is the Retry-After of a throttled answer: its
// retry_after_ms rounded up to whole seconds, at least 1. It reports false
// when the answer is not throttled, or is throttled with no retry time:
// the cost exceeds a limit's capacity (retrying never helps) or the store
// is down and the policy fails closed (the node cannot know).
func RetryAfterSeconds(resp *ratelimitv1.RateLimitResponse) (int64, bool) {
	ms := resp.GetRetryAfterMs()
	if resp.GetDecision() != ratelimitv1.RateLimitResponse_THROTTLED || ms <= 0 {
		return 0, false
	}
	return clamp((ms + 999) / 1000), true
}

// Name is the identifier of one limit in the RateLimit fields and in
// problem details: "<policy id>/<limit name>". Policy ids and limit names
// never contain '/', so the name is unambiguous.
func Name(st *ratelimitv1.LimitStatus) string {
	return st.GetPolicyId() + "/" + st.GetLimitName()
}

// Violated lists the names of the violated limits of resp.
func Violated(resp *ratelimitv1.RateLimitResponse) []string {
	var out []string
	for _, st := range resp.GetStatuses() {
		if st.GetViolated() {
			out = append(out, Name(st))
		}
	}
	return out
}

func policyList(sts []*ratelimitv1.LimitStatus) string {
	var b strings.Builder
	for i, st := range sts {
		if i > 0 {
			b.WriteString(", ")
		}
		writeString(&b, Name(st))
		// q is the quota per window w, not the burst: a client pacing at
		// q/w must meet the sustained rate (a 200/s limit with burst 400
		// advertised q=400;w=1). Nodes before the quota field send 0.
		q := st.GetQuota()
		if q <= 0 {
			q = st.GetLimit()
		}
		writeParam(&b, "q", q)
		// w must be a positive Integer; a limit without a period has none.
		if w := st.GetWindowSeconds(); w > 0 {
			writeParam(&b, "w", w)
		}
	}
	return b.String()
}

func limitList(sts []*ratelimitv1.LimitStatus, resp *ratelimitv1.RateLimitResponse) string {
	retry, throttled := RetryAfterSeconds(resp)
	var b strings.Builder
	for i, st := range sts {
		if i > 0 {
			b.WriteString(", ")
		}
		writeString(&b, Name(st))
		writeParam(&b, "r", st.GetRemaining())
		t := st.GetResetAfterSeconds()
		if st.GetViolated() {
			// The draft asks that Retry-After not end before the effective
			// window; a violated limit's own wait is at most the decision's
			// (decide picks the longest), so cap t there.
			if !throttled {
				continue // never passes: no effective window to state
			}
			t = min(t, retry)
		}
		writeParam(&b, "t", t)
	}
	return b.String()
}

// writeString writes s as an RFC 9651 String. Bytes a String cannot hold
// (controls, non-ASCII) and '%' are percent-encoded, so any input yields a
// valid, unambiguous field; validated policy names never need it.
func writeString(b *strings.Builder, s string) {
	const hex = "0123456789ABCDEF"
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e || c == '%':
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xf])
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
}

// writeParam writes ";key=n" with n as a non-negative RFC 9651 Integer.
func writeParam(b *strings.Builder, key string, n int64) {
	b.WriteByte(';')
	b.WriteString(key)
	b.WriteByte('=')
	b.WriteString(strconv.FormatInt(clamp(n), 10))
}

func nonNegative(n int64) int64 { return max(n, 0) }

// clamp keeps n within [0, the largest RFC 9651 Integer].
func clamp(n int64) int64 { return min(max(n, 0), maxInteger) }
