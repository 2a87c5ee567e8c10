package loadgen_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"image/png"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/node/nodetest"
	"github.com/allot-dev/allot/internal/tools/loadgen"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// startNoop starts allot-load's no-op server on a free port, closed when
// the test ends.
func startNoop(t *testing.T) *loadgen.NoopServer {
	t.Helper()
	s, err := loadgen.StartNoop("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// startNode starts a standalone node (in-process counters, wall clock)
// with the given policy file body; "" means no policies (all allowed).
func startNode(t *testing.T, policies string, withHTTP bool) *node.Node {
	t.Helper()
	var cfg node.Config
	if withHTTP {
		cfg.HTTPAddr = "127.0.0.1:0"
	}
	n, _ := nodetest.Start(t, policies, cfg)
	return n
}

// perClient is one token bucket per client_identifier.
func perClient(limit int64, period string, burst int64) string {
	return `policies:
  - id: load
    match: {}
    per: [client]
    limits:
      - {name: l, algorithm: token_bucket, limit: ` + strconv.FormatInt(limit, 10) + `, period: ` + period + `, burst: ` + strconv.FormatInt(burst, 10) + `}
`
}

func run(t *testing.T, cfg loadgen.Config) *loadgen.Report {
	t.Helper()
	rep, err := loadgen.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := rep.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + buf.String())
	return rep
}

// A hot key limited to 60 per hour with burst 50, hit at 1,000/s for one
// second: the bucket starts full (50) and refills 1/60 token per second,
// so over any span the test can take (under 60 s) the node admits 50 or
// at most 51. The long period is what makes the count exact whatever the
// machine's load: wall-clock jitter moves the refill by a tiny fraction
// of a token.
func TestHotKeyAdmitsBurstExactly(t *testing.T) {
	const burst = 50
	n := startNode(t, perClient(60, "1h", burst), false)
	ideal := &algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: 60, Period: time.Hour, Burst: burst}
	rep := run(t, loadgen.Config{
		Targets: []loadgen.Target{{Region: "local", Addr: n.Addr()}},
		Rate:    1000, Duration: time.Second, Concurrency: 16,
		Keys: loadgen.Keys{Dist: loadgen.Hot}, Ideal: ideal,
	})
	if rep.Total.Sent != 1000 || rep.Total.Failed != 0 || rep.Stop != loadgen.StoppedDuration {
		t.Fatalf("sent %d, failed %d, stop %s; want 1000 sent by the open-loop schedule, none failed", rep.Total.Sent, rep.Total.Failed, rep.Stop)
	}
	maxRefill := int64(rep.LastAnswer.Seconds() / 60) // whole tokens refilled over the whole run
	if a := rep.Total.Allowed; a < burst || a > burst+maxRefill+1 {
		t.Fatalf("allowed %d, want %d..%d", a, burst, burst+maxRefill+1)
	}
	if rep.Total.Throttled != rep.Total.Sent-rep.Total.Allowed {
		t.Fatalf("throttled %d != sent - allowed", rep.Total.Throttled)
	}
	// The ideal is fed due times over [0, 1s): 1/60 of a token of refill.
	if rep.IdealAdmitted != burst {
		t.Fatalf("ideal admitted %d, want %d", rep.IdealAdmitted, burst)
	}
}

// At 100/s with burst 200, the admitted count is B + L x (the time the
// node saw requests). That span is not known exactly, but it lies between
// [FirstAnswer, LastSend] and [FirstSend, LastAnswer], which bound the
// count from both sides whatever the scheduling (plus one token for the
// fractional part). The lower bound assumes the bucket never overflowed,
// i.e. the node never went B/L = 2 s without deciding a request. The gap
// between two decisions is at most the longest pause in sending plus the
// longest service time; if the machine stalled that long, only the upper
// bound is asserted, and the test says so.
func TestHotKeyAdmitsBurstPlusRefill(t *testing.T) {
	const limit, burst = 100, 200
	n := startNode(t, perClient(limit, "1s", burst), false)
	rep := run(t, loadgen.Config{
		Targets: []loadgen.Target{{Region: "local", Addr: n.Addr()}},
		Rate:    1000, Duration: 2 * time.Second, Concurrency: 16,
		Keys: loadgen.Keys{Dist: loadgen.Hot},
	})
	if rep.Total.Sent != 2000 || rep.Total.Failed != 0 {
		t.Fatalf("sent %d, failed %d; want 2000, 0", rep.Total.Sent, rep.Total.Failed)
	}
	hi := burst + limit*rep.LastAnswer.Seconds() - limit*rep.FirstSend.Seconds() + 1
	lo := burst + limit*(rep.LastSend-rep.FirstAnswer).Seconds() - 1
	a := float64(rep.Total.Allowed)
	t.Logf("allowed %v within [%.1f, %.1f] (B + L*T = %d)", a, lo, hi, burst+limit*2)
	if a > hi {
		t.Fatalf("allowed %v > upper bound %.1f", a, hi)
	}
	if stall := rep.MaxSendGap + rep.Service.Max; stall >= burst/limit*time.Second {
		t.Logf("the machine stalled for %v: lower bound not asserted", stall)
		return
	}
	if a < lo {
		t.Fatalf("allowed %v < lower bound %.1f", a, lo)
	}
}

// K = 10 uniform keys, each with burst 5 and a refill of 1 per hour:
// every key is drawn far more than 5 times in 1,000 requests, so exactly
// 50 are allowed, which shows the keys reach the node as distinct
// subjects. The ideal simulation must agree.
func TestUniformKeysAreDistinctSubjects(t *testing.T) {
	n := startNode(t, perClient(1, "1h", 5), false)
	rep := run(t, loadgen.Config{
		Targets: []loadgen.Target{{Region: "local", Addr: n.Addr()}},
		Rate:    2000, Duration: 500 * time.Millisecond,
		Keys:  loadgen.Keys{Dist: loadgen.Uniform, Count: 10},
		Ideal: &algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: 1, Period: time.Hour, Burst: 5},
	})
	if rep.Total.Sent != 1000 || rep.Total.Allowed != 50 || rep.IdealAdmitted != 50 {
		t.Fatalf("sent %d allowed %d ideal %d; want 1000, 50, 50", rep.Total.Sent, rep.Total.Allowed, rep.IdealAdmitted)
	}
}

// The region of a request is chosen by when it is due, so a shift from
// all-us to all-eu at 1 s of a 2 s run at 400/s moves exactly the 400
// requests due after it, and the series shows it interval by interval.
func TestSplitShiftMovesTraffic(t *testing.T) {
	us, eu := startNode(t, "", false), startNode(t, "", false)
	rep := run(t, loadgen.Config{
		Targets: []loadgen.Target{{Region: "us", Addr: us.Addr()}, {Region: "eu", Addr: eu.Addr()}},
		Rate:    400, Duration: 2 * time.Second, Interval: 500 * time.Millisecond,
		Keys:       loadgen.Keys{Dist: loadgen.Uniform, Count: 100},
		Split:      []loadgen.Weight{{Region: "us", Share: 1}},
		ShiftAt:    time.Second,
		ShiftSplit: []loadgen.Weight{{Region: "us", Share: 0}, {Region: "eu", Share: 1}},
	})
	if u, e := rep.Regions[0].Sent, rep.Regions[1].Sent; u != 400 || e != 400 {
		t.Fatalf("us %d eu %d, want 400 each", u, e)
	}
	if len(rep.Series) != 4 {
		t.Fatalf("%d points, want 4", len(rep.Series))
	}
	for i, p := range rep.Series {
		wantUS := int64(200)
		if i >= 2 {
			wantUS = 0
		}
		if p.Regions[0].Sent != wantUS || p.Regions[1].Sent != 200-wantUS {
			t.Errorf("point %d (%v): us %d eu %d", i, p.Offset, p.Regions[0].Sent, p.Regions[1].Sent)
		}
	}
	checkOutputs(t, rep)
}

// checkOutputs writes the CSV and PNG and reads them back.
func checkOutputs(t *testing.T, rep *loadgen.Report) {
	t.Helper()
	var buf bytes.Buffer
	if err := rep.WriteCSV(&buf); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatalf("csv does not parse: %v", err)
	}
	if len(rows) != len(rep.Series)+1 {
		t.Fatalf("%d csv rows, want a header and %d points", len(rows), len(rep.Series))
	}
	col := map[string]int{}
	for i, h := range rows[0] {
		col[h] = i
	}
	for _, h := range []string{"t_seconds", "sent", "admitted", "ideal_admitted", "cum_admitted", "p99_ms", "us_sent", "eu_sent"} {
		if _, ok := col[h]; !ok {
			t.Fatalf("csv header %v lacks %q", rows[0], h)
		}
	}
	var sent, usSent int64
	for _, r := range rows[1:] {
		sent += mustInt(t, r[col["sent"]])
		usSent += mustInt(t, r[col["us_sent"]])
	}
	last := rows[len(rows)-1]
	if sent != rep.Total.Sent || usSent != rep.Regions[0].Sent || mustInt(t, last[col["cum_admitted"]]) != rep.Total.Admitted() {
		t.Fatalf("csv sums: sent %d us %d cum %s; report %d %d %d", sent, usSent, last[col["cum_admitted"]], rep.Total.Sent, rep.Regions[0].Sent, rep.Total.Admitted())
	}
	buf.Reset()
	if err := rep.WritePNG(&buf); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatalf("png does not decode: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 600 || b.Dy() < 400 {
		t.Fatalf("png is %v", b)
	}
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The HTTP face of a real node: same counts as over gRPC.
func TestHTTPAgainstNode(t *testing.T) {
	n := startNode(t, perClient(60, "1h", 20), true)
	rep := run(t, loadgen.Config{
		Targets:  []loadgen.Target{{Region: "local", Addr: n.HTTPAddr()}},
		Protocol: loadgen.HTTP,
		Rate:     500, Duration: 400 * time.Millisecond, Concurrency: 8,
		Keys: loadgen.Keys{Dist: loadgen.Hot},
	})
	if rep.Total.Sent != 200 || rep.Total.Failed != 0 || rep.Total.Allowed < 20 || rep.Total.Allowed > 21 {
		t.Fatalf("sent %d failed %d allowed %d; want 200, 0, 20 (or 21)", rep.Total.Sent, rep.Total.Failed, rep.Total.Allowed)
	}
}

// An HTTP stub checks the wire format (POST /v1/check, JSON with proto
// field names) and answers by key; the report must count exactly what it
// answered.
func TestHTTPWireFormat(t *testing.T) {
	var answered [5]atomic.Int64 // allowed, throttled, failed open, failed, allowed degraded
	var bad atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		err := json.NewDecoder(r.Body).Decode(&body)
		switch {
		case r.Method != http.MethodPost || r.URL.Path != "/v1/check":
			err = errors.New("not POST /v1/check: " + r.Method + " " + r.URL.Path)
		case r.Header.Get("Content-Type") != "application/json":
			err = errors.New("content type " + r.Header.Get("Content-Type"))
		case err == nil && (body["client_identifier"] == nil || body["route"] != "/v1/x" || body["tenant_id"] != "acme"):
			err = errors.New("not proto field names")
		}
		if err != nil {
			bad.Store(err.Error())
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		switch body["client_identifier"] {
		case "k0":
			answered[1].Add(1)
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, `{"title":"Rate limit exceeded"}`)
		case "k1":
			answered[2].Add(1)
			_, _ = io.WriteString(w, `{"decision":"FAILED_OPEN"}`)
		case "k2":
			answered[3].Add(1)
			w.WriteHeader(http.StatusInternalServerError)
		case "k3":
			answered[4].Add(1)
			_, _ = io.WriteString(w, `{"decision":"ALLOWED","degraded":true}`)
		default:
			answered[0].Add(1)
			_, _ = io.WriteString(w, `{"decision":"ALLOWED","limit":5}`)
		}
	}))
	t.Cleanup(srv.Close)
	rep := run(t, loadgen.Config{
		Targets:  []loadgen.Target{{Region: "stub", Addr: srv.URL}},
		Protocol: loadgen.HTTP,
		Rate:     1000, Duration: 300 * time.Millisecond, Concurrency: 4,
		Keys:     loadgen.Keys{Dist: loadgen.Uniform, Count: 5},
		Template: &ratelimitv1.RateLimitRequest{TenantId: "acme", Route: "/v1/x"},
	})
	if msg := bad.Load(); msg != nil {
		t.Fatal(msg)
	}
	c := rep.Total
	if c.Sent != 300 || c.Allowed != answered[0].Load()+answered[4].Load() || c.AllowedDegraded != answered[4].Load() ||
		c.Throttled != answered[1].Load() || c.FailedOpen != answered[2].Load() || c.Failed != answered[3].Load() {
		t.Fatalf("report %+v, stub answered %d/%d/%d/%d/%d", c, answered[0].Load(), answered[1].Load(), answered[2].Load(), answered[3].Load(), answered[4].Load())
	}
	if c.Throttled == 0 || c.FailedOpen == 0 || c.Failed == 0 || c.AllowedDegraded == 0 {
		t.Fatalf("some outcome never drawn: %+v", c)
	}
}

// Closed loop against the no-op server stops at exactly MaxRequests, and
// the no-op server allows everything.
func TestClosedLoopMaxRequestsAgainstNoop(t *testing.T) {
	s := startNoop(t)
	rep := run(t, loadgen.Config{
		Targets:     []loadgen.Target{{Region: "noop", Addr: s.Addr()}},
		Concurrency: 8, Duration: time.Minute, MaxRequests: 500,
	})
	if rep.Total.Sent != 500 || rep.Total.Allowed != 500 || rep.Stop != loadgen.StoppedMaxRequests {
		t.Fatalf("sent %d allowed %d stop %s; want 500, 500, max-requests", rep.Total.Sent, rep.Total.Allowed, rep.Stop)
	}
}

// checkFunc is a Checker made of a function.
type checkFunc func(context.Context, *ratelimitv1.RateLimitRequest) (ratelimitv1.RateLimitResponse_Decision, error)

func (f checkFunc) Check(ctx context.Context, r *ratelimitv1.RateLimitRequest) (loadgen.Answer, error) {
	d, err := f(ctx, r)
	return loadgen.Answer{Decision: d}, err
}
func (checkFunc) Close() error { return nil }

// Cancelling the context stops the run with a report of what was sent.
func TestInterruptStopsWithReport(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var calls atomic.Int64
	rep, err := loadgen.Run(ctx, loadgen.Config{
		Targets: []loadgen.Target{{Region: "fake"}},
		Rate:    1000, Duration: time.Hour, Concurrency: 4,
		Dial: func(loadgen.Target) (loadgen.Checker, error) {
			return checkFunc(func(context.Context, *ratelimitv1.RateLimitRequest) (ratelimitv1.RateLimitResponse_Decision, error) {
				if calls.Add(1) == 100 {
					cancel()
				}
				return ratelimitv1.RateLimitResponse_ALLOWED, nil
			}), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Stop != loadgen.StoppedInterrupted || rep.Total.Sent < 100 || rep.Total.Sent != calls.Load() {
		t.Fatalf("stop %s sent %d calls %d", rep.Stop, rep.Total.Sent, calls.Load())
	}
}

// No coordinated omission: with one worker and a server that stalls the
// first request for 100 ms, the requests due during the stall leave late
// and their latency counts from when they were due. A closed-loop
// measurement would show one slow request; here the ~90 requests due in
// the first 90 ms all show at least 10 ms, whatever the machine's speed
// (the stall is at least 100 ms, so they cannot leave before it ends).
func TestLatencyCountsFromDueTime(t *testing.T) {
	var first atomic.Bool
	rep, err := loadgen.Run(t.Context(), loadgen.Config{
		Targets: []loadgen.Target{{Region: "fake"}},
		Rate:    1000, Duration: 200 * time.Millisecond, Concurrency: 1,
		Dial: func(loadgen.Target) (loadgen.Checker, error) {
			return checkFunc(func(ctx context.Context, _ *ratelimitv1.RateLimitRequest) (ratelimitv1.RateLimitResponse_Decision, error) {
				if first.CompareAndSwap(false, true) {
					// The simulated stall of the server, not synchronisation.
					select {
					case <-time.After(100 * time.Millisecond):
					case <-ctx.Done():
					}
				}
				return ratelimitv1.RateLimitResponse_ALLOWED, nil
			}), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	slow := rep.Total.Latency.Count - countBelow(rep, 10*time.Millisecond)
	if rep.Total.Sent != 200 || slow < 90 {
		t.Fatalf("sent %d, %d requests at >= 10 ms; want 200 sent and >= 90 slow", rep.Total.Sent, slow)
	}
	if rep.Lag.Max < 90*time.Millisecond {
		t.Fatalf("max send lag %v, want >= 90ms", rep.Lag.Max)
	}
}

// MinMeasured outlasts late first answers: each worker's first call
// takes the whole run (a server whose first answers come late), so by
// Duration nothing due after the warm-up was sent; the run goes on until
// one measured request is answered instead of ending with none.
func TestMinMeasuredOutlastsLateFirstAnswers(t *testing.T) {
	const workers, d = 2, 200 * time.Millisecond
	var calls atomic.Int64
	rep, err := loadgen.Run(t.Context(), loadgen.Config{
		Targets:     []loadgen.Target{{Region: "fake"}},
		Concurrency: workers, Duration: d, Warmup: d / 2, MinMeasured: 1,
		Dial: func(loadgen.Target) (loadgen.Checker, error) {
			return checkFunc(func(ctx context.Context, _ *ratelimitv1.RateLimitRequest) (ratelimitv1.RateLimitResponse_Decision, error) {
				if calls.Add(1) <= workers {
					// The simulated slow start of the server, not synchronisation.
					select {
					case <-time.After(d):
					case <-ctx.Done():
					}
				}
				return ratelimitv1.RateLimitResponse_ALLOWED, nil
			}), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	m := rep.Measured
	if m.Sent < 1 || m.Allowed != m.Sent || m.Latency.Count < 1 || m.Span <= 0 || rep.Stop != loadgen.StoppedDuration {
		t.Fatalf("measured %d sent, %d allowed, %d latencies over %v, stop %s; want at least one answered, stopped by duration",
			m.Sent, m.Allowed, m.Latency.Count, m.Span, rep.Stop)
	}
	if rep.Total.Sent != calls.Load() {
		t.Fatalf("report counts %d sent, the server %d", rep.Total.Sent, calls.Load())
	}
}

func countBelow(rep *loadgen.Report, d time.Duration) int64 {
	var n int64
	for _, b := range rep.Histogram.Distribution() {
		if b.To < d.Microseconds() {
			n += b.Count
		}
	}
	return n
}

func TestBadConfigIsRejected(t *testing.T) {
	for name, cfg := range map[string]loadgen.Config{
		"no target":           {Duration: time.Second},
		"no duration":         {Targets: []loadgen.Target{{Region: "a", Addr: "127.0.0.1:1"}}},
		"bad zipf":            {Targets: []loadgen.Target{{Region: "a", Addr: "127.0.0.1:1"}}, Duration: time.Second, Keys: loadgen.Keys{Dist: loadgen.Zipf, Count: 10, S: math.NaN()}},
		"unknown region":      {Targets: []loadgen.Target{{Region: "a", Addr: "127.0.0.1:1"}}, Duration: time.Second, Keys: loadgen.Keys{Count: 1}, Split: []loadgen.Weight{{Region: "b", Share: 1}}},
		"shift without split": {Targets: []loadgen.Target{{Region: "a", Addr: "127.0.0.1:1"}}, Duration: time.Second, Keys: loadgen.Keys{Count: 1}, ShiftAt: time.Second},
		"warm-up too long":    {Targets: []loadgen.Target{{Region: "a", Addr: "127.0.0.1:1"}}, Duration: time.Second, Warmup: time.Second},
		"negative warm-up":    {Targets: []loadgen.Target{{Region: "a", Addr: "127.0.0.1:1"}}, Duration: time.Second, Warmup: -time.Second},
		"min measured open":   {Targets: []loadgen.Target{{Region: "a", Addr: "127.0.0.1:1"}}, Duration: time.Second, Rate: 10, MinMeasured: 1},
		"negative min":        {Targets: []loadgen.Target{{Region: "a", Addr: "127.0.0.1:1"}}, Duration: time.Second, MinMeasured: -1},
	} {
		if _, err := loadgen.Run(t.Context(), cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A region named twice is one region of two nodes: the split is between
// regions, and each region's part is spread evenly over its nodes. The
// counts are the servers' own.
func TestRegionTrafficSpreadsOverItsNodes(t *testing.T) {
	var noops []*loadgen.NoopServer
	for range 3 {
		noops = append(noops, startNoop(t))
	}
	us1, eu, us2 := noops[0], noops[1], noops[2]
	targets, err := loadgen.ParseTargets("us=" + us1.Addr() + ",eu=" + eu.Addr() + ",us=" + us2.Addr())
	if err != nil {
		t.Fatal(err)
	}
	const n = 2000
	rep := run(t, loadgen.Config{
		Targets: targets, Concurrency: 8, Duration: time.Minute, MaxRequests: n,
		Split: []loadgen.Weight{{Region: "us", Share: 0.5}, {Region: "eu", Share: 0.5}},
	})
	if len(rep.Regions) != 2 || rep.Regions[0].Region != "us" || rep.Regions[1].Region != "eu" {
		t.Fatalf("regions %+v, want us then eu", rep.Regions)
	}
	if want := us1.Addr() + "," + us2.Addr(); rep.Regions[0].Addr != want {
		t.Errorf("us address %q, want %q", rep.Regions[0].Addr, want)
	}
	a, b, e := us1.Checks(), us2.Checks(), eu.Checks()
	t.Logf("us nodes %d and %d, eu %d", a, b, e)
	if a+b != rep.Regions[0].Sent || e != rep.Regions[1].Sent || a+b+e != n {
		t.Fatalf("servers counted us %d+%d eu %d; the report says us %d eu %d of %d", a, b, e, rep.Regions[0].Sent, rep.Regions[1].Sent, n)
	}
	if math.Abs(float64(e)-n/2) > 0.1*n/2 {
		t.Errorf("eu got %d of %d, want about half: the split is per region, not per node", e, n)
	}
	for _, c := range []int64{a, b} {
		if math.Abs(float64(c)-float64(a+b)/2) > 0.1*float64(a+b)/2 {
			t.Errorf("us nodes got %d and %d, want about half of %d each", a, b, a+b)
		}
	}
}
