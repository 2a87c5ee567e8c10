package server

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/allot-dev/allot/internal/decide"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// wantResponse is the answer of d field by field, as the proto documents
// each field: the reference appendResponse is checked against.
func wantResponse(d *decide.Decision) *ratelimitv1.RateLimitResponse {
	status := func(st *decide.Status) *ratelimitv1.LimitStatus {
		return &ratelimitv1.LimitStatus{
			PolicyId: st.PolicyID, LimitName: st.LimitName, Limit: st.Limit, Remaining: st.Remaining,
			ResetAfterSeconds: decide.Seconds(max(st.ResetAfter, st.RetryAfter)),
			WindowSeconds:     decide.Seconds(st.Window),
			Violated:          st.Violated, Exact: st.Exact, Quota: st.Quota,
		}
	}
	out := &ratelimitv1.RateLimitResponse{
		Decision: ratelimitv1.RateLimitResponse_Decision(d.Outcome),
		Limit:    d.Limit, Remaining: d.Remaining,
		ResetAfterSeconds: decide.Seconds(d.ResetAfter),
		ViolationReason:   d.Reason,
		RetryAfterMs:      ceilMillis(d.RetryAfter),
		PolicyId:          d.PolicyID,
		Degraded:          d.Degraded,
	}
	for i := range d.Statuses {
		out.Statuses = append(out.Statuses, status(&d.Statuses[i]))
	}
	for i := range d.Shadow {
		out.ShadowViolations = append(out.ShadowViolations, status(&d.Shadow[i]))
	}
	return out
}

// checkEncoding asserts appendResponse writes exactly protobuf-go's
// marshalling of wantResponse, alone and inside a batch answer, and that
// response decodes it back.
func checkEncoding(t *testing.T, d *decide.Decision) {
	t.Helper()
	want := wantResponse(d)
	wire, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
	require.NoError(t, err)
	prefix := []byte("kept")
	got := appendResponse(append([]byte(nil), prefix...), d)
	require.Equal(t, prefix, got[:len(prefix)], "appends, never overwrites")
	require.Equal(t, wire, got[len(prefix):])
	require.True(t, proto.Equal(want, response(d)))

	var b []byte
	for range 3 {
		var at int
		b, at = openMessage(b, 1)
		b = closeMessage(appendResponse(b, d), at)
	}
	batch, err := proto.Marshal(&ratelimitv1.BatchRateLimitResponse{Responses: []*ratelimitv1.RateLimitResponse{want, want, want}})
	require.NoError(t, err)
	require.Equal(t, batch, b)
}

func TestAppendResponseIsMarshal(t *testing.T) {
	long := strings.Repeat("p", 300) // a length of two varint bytes, and an answer of more
	st := decide.Status{PolicyID: "per-tenant", LimitName: "per_second", Limit: 100, Quota: 60, Remaining: 41,
		ResetAfter: 1500 * time.Millisecond, Window: time.Minute, Exact: true}
	violated := st
	violated.Violated, violated.Remaining, violated.RetryAfter = true, 0, 3*time.Second
	for name, d := range map[string]decide.Decision{
		"empty":   {},
		"allowed": {Limit: 100, Remaining: 41, ResetAfter: 1500 * time.Millisecond, PolicyID: "per-tenant", Statuses: []decide.Status{st}},
		"throttled": {Outcome: decide.Throttled, Limit: 100, ResetAfter: 3 * time.Second, RetryAfter: 2500*time.Microsecond + time.Second,
			Reason: "per-tenant/per_second", PolicyID: "per-tenant", Statuses: []decide.Status{st, violated}, Shadow: []decide.Status{violated}},
		"failed open": {Outcome: decide.FailedOpen, Degraded: true, PolicyID: "p"},
		"negative":    {Limit: -1, Remaining: math.MinInt64, Statuses: []decide.Status{{Limit: -5, Quota: -1, Remaining: -2}}},
		"long":        {PolicyID: long, Reason: long, Statuses: []decide.Status{{PolicyID: long, LimitName: long}}, Shadow: []decide.Status{{}}},
		"never":       {Outcome: decide.Throttled, RetryAfter: math.MaxInt64, Statuses: []decide.Status{{Violated: true, RetryAfter: math.MaxInt64}}},
	} {
		t.Run(name, func(t *testing.T) { checkEncoding(t, &d) })
	}
}

func FuzzAppendResponse(f *testing.F) {
	f.Add(int8(1), int64(100), int64(41), int64(1500), "per-tenant", "per_second", uint8(1), uint8(0), true)
	f.Add(int8(0), int64(0), int64(0), int64(0), "", "", uint8(0), uint8(0), false)
	f.Fuzz(func(t *testing.T, outcome int8, limit, remaining, ms int64, policy, name string, statuses, shadow uint8, flag bool) {
		dur := time.Duration(ms) * time.Millisecond
		st := func(i int) decide.Status {
			return decide.Status{PolicyID: policy, LimitName: name, Limit: limit + int64(i), Quota: limit / 2, Remaining: remaining - int64(i),
				ResetAfter: dur, RetryAfter: dur / 3, Window: time.Duration(i) * dur, Violated: flag == (i%2 == 0), Exact: i%3 == 0}
		}
		d := decide.Decision{Outcome: decide.Outcome(outcome % 3), Limit: limit, Remaining: remaining, ResetAfter: dur, RetryAfter: -dur,
			Reason: name, PolicyID: policy, Degraded: flag}
		for i := range int(statuses % 5) {
			d.Statuses = append(d.Statuses, st(i))
		}
		for i := range int(shadow % 3) {
			d.Shadow = append(d.Shadow, st(i+7))
		}
		checkEncoding(t, &d)
	})
}
