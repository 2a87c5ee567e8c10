package server

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/policy"
	"github.com/allot-dev/allot/problem"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
	"github.com/allot-dev/allot/ratelimitheaders"
)

// DefaultEnvoyKeys is the default mapping of descriptor entry keys to
// request fields: each field by its own name, and Envoy's remote_address
// action (key "remote_address") as the ip.
func DefaultEnvoyKeys() map[string]policy.Field {
	return map[string]policy.Field{
		"tenant":         policy.FieldTenant,
		"client":         policy.FieldClient,
		"route":          policy.FieldRoute,
		"method":         policy.FieldMethod,
		"ip":             policy.FieldIP,
		"tier":           policy.FieldTier,
		"remote_address": policy.FieldIP,
	}
}

// EnvoyOptions configure the Envoy face. The zero value is usable.
type EnvoyOptions struct {
	// Keys maps descriptor entry keys to request fields; nil means
	// DefaultEnvoyKeys. An entry whose key is not in the map fails the
	// call: ignoring it would silently merge callers it was meant to split.
	Keys map[string]policy.Field
	// Observe, when set, is called once per decided descriptor.
	Observe func(ctx context.Context, ev Event)
}

// Envoy implements Envoy's global rate limit service,
// envoy.service.ratelimit.v3.RateLimitService, over the same checker as
// the gRPC and HTTP faces.
//
// Each descriptor is one check: its entries fill the request fields (see
// EnvoyOptions.Keys) and its hits_addend, else the request's, is the cost
// (0 means the route's cost from the policy file, as Envoy's "unset means
// 1" does when no cost is configured). The domain is required, as Envoy
// requires it, but does not select policies: the node's policy file is
// the one configuration. A descriptor's own limit override is ignored for
// the same reason. Descriptors are decided in order and independently, as
// envoyproxy/ratelimit does: an over-limit one does not refund the others.
type Envoy struct {
	rlsv3.UnimplementedRateLimitServiceServer
	checker Checker
	keys    map[string]policy.Field
	observe func(ctx context.Context, ev Event)
}

// NewEnvoy returns the Envoy rate limit service over c.
func NewEnvoy(c Checker, opts EnvoyOptions) *Envoy {
	keys := opts.Keys
	if keys == nil {
		keys = DefaultEnvoyKeys()
	}
	return &Envoy{checker: c, keys: keys, observe: opts.Observe}
}

// ShouldRateLimit decides every descriptor of in. A bad descriptor fails
// the call with INVALID_ARGUMENT before anything is counted; Envoy then
// applies its failure_mode_deny setting.
func (s *Envoy) ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if in.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "domain: empty")
	}
	ds := in.GetDescriptors()
	if len(ds) == 0 || len(ds) > MaxBatch {
		return nil, status.Errorf(codes.InvalidArgument, "descriptors: %d, want 1 to %d", len(ds), MaxBatch)
	}
	reqs := make([]decide.Request, len(ds))
	for i, d := range ds {
		r, err := s.request(d, in.GetHitsAddend())
		if err != nil {
			return nil, grpcError(fmt.Errorf("descriptors[%d].%w", i, err))
		}
		reqs[i] = r
	}
	out := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(reqs))}
	answers := make([]*ratelimitv1.RateLimitResponse, len(reqs))
	for i := range reqs {
		start := time.Now()
		d, err := s.checker.CheckAppend(ctx, &reqs[i], nil)
		if s.observe != nil {
			s.observe(ctx, Event{Face: "envoy", Decision: decisionOrNil(&d, err), Err: err, Elapsed: time.Since(start)})
		}
		if err != nil {
			return nil, grpcError(fmt.Errorf("descriptors[%d]: %w", i, err))
		}
		out.Statuses[i] = descriptorStatus(&d)
		if d.Outcome == decide.Throttled {
			out.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		answers[i] = response(&d)
	}
	merged := merge(answers)
	h := http.Header{}
	ratelimitheaders.Set(h, merged)
	if out.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		// Envoy sends raw_body as its 429 body; make it the same problem
		// document the HTTP faces send.
		w := &bodyRecorder{h: h}
		problem.Write(w, problem.Throttled(merged, envoyInstance(reqs, out.Statuses)))
		out.RawBody = w.body
		h.Del("Content-Length") // Envoy sets its own
	}
	out.ResponseHeadersToAdd = headerValues(h)
	return out, nil
}

// envoyInstance is raw_body's instance, as the HTTP 429 has one: the
// route of the first over-limit descriptor that names one (Envoy sends no
// request path), else "/" .
func envoyInstance(reqs []decide.Request, sts []*rlsv3.RateLimitResponse_DescriptorStatus) string {
	for i, st := range sts {
		if st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT && reqs[i].Route != "" {
			return reqs[i].Route
		}
	}
	for i := range reqs {
		if reqs[i].Route != "" {
			return reqs[i].Route
		}
	}
	return "/"
}

func decisionOrNil(d *decide.Decision, err error) *decide.Decision {
	if err != nil {
		return nil
	}
	return d
}

// request turns one descriptor into a validated check.
func (s *Envoy) request(d *ratelimitcommonv3.RateLimitDescriptor, hits uint32) (decide.Request, error) {
	if d.GetIsNegativeHits() {
		return decide.Request{}, &decide.InvalidError{Field: "is_negative_hits", Msg: "not supported: Allot does not refund on request"}
	}
	r := decide.Request{Cost: int64(hits)}
	if ha := d.GetHitsAddend(); ha != nil {
		r.Cost = int64(min(ha.GetValue(), uint64(decide.MaxCost)+1)) // out of range stays out of range
	}
	seen := map[policy.Field]bool{}
	for j, e := range d.GetEntries() {
		f, ok := s.keys[e.GetKey()]
		if !ok {
			return decide.Request{}, &decide.InvalidError{Field: fmt.Sprintf("entries[%d]", j), Msg: fmt.Sprintf("unknown key %q", e.GetKey())}
		}
		if seen[f] {
			return decide.Request{}, &decide.InvalidError{Field: fmt.Sprintf("entries[%d]", j), Msg: fmt.Sprintf("key %q sets %s twice", e.GetKey(), f)}
		}
		seen[f] = true
		if p := decide.Field(&r, f); p != nil {
			*p = e.GetValue()
		}
	}
	return r, decide.Validate(&r)
}

// descriptorStatus describes d's deciding limit; a descriptor no
// enforced limit applied to is OK with no current_limit.
func descriptorStatus(d *decide.Decision) *rlsv3.RateLimitResponse_DescriptorStatus {
	out := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	if d.Outcome == decide.Throttled {
		out.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	st := deciding(d)
	if st == nil {
		return out
	}
	out.CurrentLimit = currentLimit(st)
	out.LimitRemaining = uint32(min(max(d.Remaining, 0), math.MaxUint32))
	out.DurationUntilReset = durationpb.New(d.ResetAfter)
	return out
}

// deciding finds the status the decision's Limit and Remaining describe.
func deciding(d *decide.Decision) *decide.Status {
	throttled := d.Outcome == decide.Throttled
	for i := range d.Statuses {
		st := &d.Statuses[i]
		if st.PolicyID == d.PolicyID && st.Limit == d.Limit && st.Remaining == d.Remaining && st.Violated == throttled {
			return st
		}
	}
	return nil
}

// envoyUnits are the fixed-length units of Envoy's RateLimit.Unit,
// longest first. MONTH and YEAR have no fixed length and are never used.
var envoyUnits = [...]struct {
	unit rlsv3.RateLimitResponse_RateLimit_Unit
	d    time.Duration
}{
	{rlsv3.RateLimitResponse_RateLimit_WEEK, 7 * 24 * time.Hour},
	{rlsv3.RateLimitResponse_RateLimit_DAY, 24 * time.Hour},
	{rlsv3.RateLimitResponse_RateLimit_HOUR, time.Hour},
	{rlsv3.RateLimitResponse_RateLimit_MINUTE, time.Minute},
	{rlsv3.RateLimitResponse_RateLimit_SECOND, time.Second},
}

// currentLimit states st as "quota per period" (the limit, not its burst:
// a client pacing at the burst would go twice as fast). A period of whole
// seconds is the longest unit that divides it, times unit_multiplier
// (90s is 1m30s: SECOND x 90; 2h is HOUR x 2). A sub-second or fractional
// period is scaled to SECOND, rounding requests_per_unit down.
func currentLimit(st *decide.Status) *rlsv3.RateLimitResponse_RateLimit {
	out := &rlsv3.RateLimitResponse_RateLimit{Name: st.PolicyID + "/" + st.LimitName}
	quota := st.Quota
	if quota <= 0 {
		quota = st.Limit
	}
	capacity := min(max(quota, 0), math.MaxUint32)
	if st.Window <= 0 {
		out.RequestsPerUnit = uint32(capacity) // UNKNOWN unit
		return out
	}
	if st.Window%time.Second == 0 {
		for _, u := range envoyUnits {
			if st.Window%u.d == 0 {
				out.Unit, out.RequestsPerUnit = u.unit, uint32(capacity)
				if m := st.Window / u.d; m > 1 {
					out.UnitMultiplier = wrapperspb.UInt32(uint32(min(m, math.MaxUint32)))
				}
				return out
			}
		}
	}
	perSecond := float64(capacity) * float64(time.Second) / float64(st.Window)
	out.Unit, out.RequestsPerUnit = rlsv3.RateLimitResponse_RateLimit_SECOND, uint32(min(perSecond, math.MaxUint32))
	return out
}

// merge folds the answers of several descriptors into one for the header
// fields: the deciding answer is the throttled one with the longest wait,
// else the one with the fewest tokens left; the lists hold every limit
// once, at its tightest (violated, else lowest remaining).
func merge(answers []*ratelimitv1.RateLimitResponse) *ratelimitv1.RateLimitResponse {
	var best *ratelimitv1.RateLimitResponse
	for _, a := range answers {
		if best == nil || outranks(a, best) {
			best = a
		}
	}
	out := &ratelimitv1.RateLimitResponse{
		Decision: best.GetDecision(), Limit: best.GetLimit(), Remaining: best.GetRemaining(),
		ResetAfterSeconds: best.GetResetAfterSeconds(), ViolationReason: best.GetViolationReason(),
		RetryAfterMs: best.GetRetryAfterMs(), PolicyId: best.GetPolicyId(),
	}
	at := map[string]int{}
	// The deciding answer's limits first, so they lead the lists.
	for _, a := range append([]*ratelimitv1.RateLimitResponse{best}, answers...) {
		for _, st := range a.GetStatuses() {
			name := ratelimitheaders.Name(st)
			if i, ok := at[name]; ok {
				if tighter(st, out.Statuses[i]) {
					out.Statuses[i] = st
				}
				continue
			}
			at[name] = len(out.Statuses)
			out.Statuses = append(out.Statuses, st)
		}
	}
	return out
}

// tighter orders two states of one limit: violated first, then fewer left.
func tighter(a, b *ratelimitv1.LimitStatus) bool {
	if a.GetViolated() != b.GetViolated() {
		return a.GetViolated()
	}
	return a.GetRemaining() < b.GetRemaining()
}

// outranks orders answers for merge: throttled first (longest wait), then
// answers that counted something (fewest remaining), then the rest.
func outranks(a, b *ratelimitv1.RateLimitResponse) bool {
	const throttled = ratelimitv1.RateLimitResponse_THROTTLED
	if (a.GetDecision() == throttled) != (b.GetDecision() == throttled) {
		return a.GetDecision() == throttled
	}
	if a.GetDecision() == throttled {
		return a.GetRetryAfterMs() > b.GetRetryAfterMs()
	}
	if (len(a.GetStatuses()) > 0) != (len(b.GetStatuses()) > 0) {
		return len(a.GetStatuses()) > 0
	}
	return a.GetRemaining() < b.GetRemaining()
}

// headerValues lists h in a stable order, for Envoy.
func headerValues(h http.Header) []*corev3.HeaderValue {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var out []*corev3.HeaderValue
	for _, k := range keys {
		for _, v := range h[k] {
			out = append(out, &corev3.HeaderValue{Key: k, Value: v})
		}
	}
	return out
}

// bodyRecorder captures what problem.Write writes, to put it in raw_body.
type bodyRecorder struct {
	h    http.Header
	body []byte
}

func (r *bodyRecorder) Header() http.Header { return r.h }
func (r *bodyRecorder) WriteHeader(int)     {}
func (r *bodyRecorder) Write(p []byte) (int, error) {
	r.body = append(r.body, p...)
	return len(p), nil
}
