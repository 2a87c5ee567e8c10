package decide

import (
	"fmt"
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

// Input is a check request as it arrives on the wire, before validation.
type Input struct {
	Tenant string
	Client string
	Route  string
	Method string
	IP     string
	Tier   string
	Cost   int64
}

// Field is the field of in that f names, nil if f names none: the one
// mapping of policy fields onto a check's input, for the faces that build
// an Input from named fields (Envoy descriptors, RLQS bucket ids).
func (in *Input) Field(f policy.Field) *string {
	switch f {
	case policy.FieldTenant:
		return &in.Tenant
	case policy.FieldClient:
		return &in.Client
	case policy.FieldRoute:
		return &in.Route
	case policy.FieldMethod:
		return &in.Method
	case policy.FieldIP:
		return &in.IP
	case policy.FieldTier:
		return &in.Tier
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

// Request validates in and returns the policy request it describes, or an
// *InvalidError naming the first field at fault.
func (in *Input) Request() (policy.Request, error) {
	for _, f := range [...]struct {
		name, val string
		max       int
	}{
		{"tenant_id", in.Tenant, MaxIdentityLen},
		{"client_identifier", in.Client, MaxIdentityLen},
		{"tier", in.Tier, MaxIdentityLen},
		{"route", in.Route, MaxRouteLen},
		{"method", in.Method, MaxMethodLen},
		{"ip", in.IP, 64},
	} {
		if len(f.val) > f.max {
			return policy.Request{}, invalid(f.name, "longer than %d bytes", f.max)
		}
		if !utf8.ValidString(f.val) {
			return policy.Request{}, invalid(f.name, "not valid UTF-8")
		}
	}
	if in.Tenant == "" && in.Client == "" && in.IP == "" {
		return policy.Request{}, invalid("tenant_id", "empty identity: set at least one of tenant_id, client_identifier, ip")
	}
	if in.Cost < 0 || in.Cost > MaxCost {
		return policy.Request{}, invalid("token_cost", "%d out of range [0, %d] (0 means the route's cost)", in.Cost, MaxCost)
	}
	r := policy.Request{
		Tenant: in.Tenant,
		Client: in.Client,
		Route:  in.Route,
		Method: strings.ToUpper(in.Method),
		Tier:   in.Tier,
		Cost:   in.Cost,
	}
	if in.IP != "" {
		a, err := policy.ParseIP(in.IP)
		if err != nil {
			return policy.Request{}, invalid("ip", "not an IP address: %q", in.IP)
		}
		r.IP = a
	}
	return r, nil
}

// Request is a validated check request.
type Request = policy.Request
