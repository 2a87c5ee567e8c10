package decide

import (
	"fmt"
	"net/netip"
	"strings"
	"unicode/utf8"

	"github.com/allot-dev/allot/policy"
)

// Maximum field lengths, in bytes. Longer values are rejected rather than
// truncated: a truncated identity would merge distinct callers' counters.
const (
	MaxIdentityLen = 256  // tenant_id, client_identifier, tier
	MaxRouteLen    = 2048 // route
	MaxMethodLen   = 16   // method
	MaxCost        = policy.MaxCost
)

// Request is a check request: a face fills it with the fields as sent
// (the IP as text in IPText) and Validate readies it for a decision.
// One type from the decoded message to the decision, so that no face
// copies a request into another shape.
type Request = policy.Request

// Field is the field of r that f names as it is sent (the IP as text),
// nil if f names none: the one mapping of policy fields onto a check, for
// the faces that fill a request from named fields (Envoy descriptors,
// RLQS bucket ids).
func Field(r *Request, f policy.Field) *string {
	switch f {
	case policy.FieldTenant:
		return &r.Tenant
	case policy.FieldClient:
		return &r.Client
	case policy.FieldRoute:
		return &r.Route
	case policy.FieldMethod:
		return &r.Method
	case policy.FieldIP:
		return &r.IPText
	case policy.FieldTier:
		return &r.Tier
	}
	return nil
}

// InvalidError says what is wrong with a request. Servers answer it with
// gRPC InvalidArgument or HTTP 400; it is the only bad-input error type.
type InvalidError struct {
	Field string
	Msg   string
}

func (e *InvalidError) Error() string { return e.Field + ": " + e.Msg }

func invalid(field, format string, args ...any) *InvalidError {
	return &InvalidError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Validate checks r as it was sent and readies it for a decision in
// place: the method upper-cased, IPText parsed into IP. It returns an
// *InvalidError naming the first field at fault.
func Validate(r *Request) error {
	for _, f := range [...]struct {
		name, val string
		max       int
	}{
		{"tenant_id", r.Tenant, MaxIdentityLen},
		{"client_identifier", r.Client, MaxIdentityLen},
		{"tier", r.Tier, MaxIdentityLen},
		{"route", r.Route, MaxRouteLen},
		{"method", r.Method, MaxMethodLen},
		{"ip", r.IPText, 64},
	} {
		if len(f.val) > f.max {
			return invalid(f.name, "longer than %d bytes", f.max)
		}
		if !utf8.ValidString(f.val) {
			return invalid(f.name, "not valid UTF-8")
		}
	}
	if r.Tenant == "" && r.Client == "" && r.IPText == "" {
		return invalid("tenant_id", "empty identity: set at least one of tenant_id, client_identifier, ip")
	}
	if r.Cost < 0 || r.Cost > MaxCost {
		return invalid("token_cost", "%d out of range [0, %d] (0 means the route's cost)", r.Cost, MaxCost)
	}
	r.Method = strings.ToUpper(r.Method) // no copy when already upper case
	r.IP = netip.Addr{}
	if r.IPText != "" {
		a, err := policy.ParseIP(r.IPText)
		if err != nil {
			return invalid("ip", "not an IP address: %q", r.IPText)
		}
		r.IP = a
	}
	return nil
}
