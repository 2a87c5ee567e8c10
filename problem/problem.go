// Package problem writes RFC 9457 problem details (application/problem+json)
// for Allot's HTTP answers: the 429 of a throttled check (Throttled), the
// 400 of a bad one (BadRequest), and any other failure by its status code
// alone (Status: the node's HTTP face answers 405, 503 and 500 so). The
// node's HTTP check, the middleware, the reverse proxy and Envoy's
// raw_body (the body of Envoy's 429) all throttle through it, so a
// throttled client reads the same document from each; the admin API's
// errors extend its Details. It writes only the response it is handed,
// and keeps no state.
package problem

import (
	"encoding/json"
	"net/http"
	"strconv"

	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
	"github.com/allot-dev/allot/ratelimitheaders"
)

// ContentType is the media type of a problem details document.
const ContentType = "application/problem+json"

// Problem types. QuotaExceeded is the type the RateLimit fields draft
// (draft-ietf-httpapi-ratelimit-headers-11, section 5.1) registers.
const (
	QuotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	Blank         = "about:blank" // RFC 9457 4.2.1: the status code says it all
)

// Details is a problem details document. The RFC 9457 members come first;
// RetryAfterSeconds and ViolatedPolicies are this API's extensions (the
// latter named as the draft's quota-exceeded type names it).
type Details struct {
	Type              string   `json:"type"`
	Title             string   `json:"title"`
	Status            int      `json:"status"`
	Detail            string   `json:"detail,omitempty"`
	Instance          string   `json:"instance,omitempty"`
	RetryAfterSeconds *int64   `json:"retry_after_seconds,omitempty"`
	ViolatedPolicies  []string `json:"violated-policies,omitempty"`
	// Field names the request field at fault in a 400.
	Field string `json:"field,omitempty"`
}

// Throttled describes a throttled answer for the request at instance (a
// URI reference: the route that was limited).
func Throttled(resp *ratelimitv1.RateLimitResponse, instance string) *Details {
	d := &Details{
		Type:             QuotaExceeded,
		Title:            "Rate limit exceeded",
		Status:           http.StatusTooManyRequests,
		Detail:           resp.GetViolationReason(),
		Instance:         instance,
		ViolatedPolicies: ratelimitheaders.Violated(resp),
	}
	if ra, ok := ratelimitheaders.RetryAfterSeconds(resp); ok {
		d.RetryAfterSeconds = &ra
	}
	return d
}

// BadRequest describes a request rejected as invalid; field may be empty.
func BadRequest(detail, field, instance string) *Details {
	return &Details{Type: Blank, Title: http.StatusText(http.StatusBadRequest), Status: http.StatusBadRequest, Detail: detail, Field: field, Instance: instance}
}

// Status describes any other failure by its status code alone.
func Status(code int, detail string) *Details {
	return &Details{Type: Blank, Title: http.StatusText(code), Status: code, Detail: detail}
}

// Write sends d with its status code. Headers already set on w (the
// RateLimit fields) are kept.
func Write(w http.ResponseWriter, d *Details) {
	body, err := json.Marshal(d)
	if err != nil { // unreachable: Details has only strings and numbers
		body = []byte(`{"type":"about:blank","status":500}`)
		d.Status = http.StatusInternalServerError
	}
	body = append(body, '\n')
	h := w.Header()
	h.Set("Content-Type", ContentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store") // a throttle answer is about this moment only
	w.WriteHeader(d.Status)
	_, _ = w.Write(body) // the client went away; nothing to do
}
