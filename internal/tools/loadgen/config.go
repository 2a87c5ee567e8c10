package loadgen

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/allot-dev/allot/algorithm"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// Protocol is how a run talks to its targets.
type Protocol uint8

// The protocols.
const (
	// GRPC calls RateLimiterService.CheckRateLimit.
	GRPC Protocol = iota
	// HTTP posts the JSON form of the request (proto field names) to
	// /v1/check: 200 carries the decision, 429 is THROTTLED.
	HTTP
)

// String returns the flag spelling of p.
func (p Protocol) String() string {
	if p == HTTP {
		return "http"
	}
	return "grpc"
}

// ParseProtocol returns the protocol spelled s (grpc, http).
func ParseProtocol(s string) (Protocol, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "grpc":
		return GRPC, nil
	case "http":
		return HTTP, nil
	}
	return 0, fmt.Errorf("unknown protocol %q (want grpc or http)", s)
}

// Target is a node of a region, by address: host:port for gRPC, host:port
// or a base URL (http://host:port) for HTTP. A region may have several
// Targets (nodes): its share of the traffic goes to them in turn.
type Target struct {
	Region string
	Addr   string
}

// ParseTargets parses "us=127.0.0.1:8081,eu=127.0.0.1:9081"; a region
// named again adds a node to it ("us=127.0.0.1:8081,us=127.0.0.1:8082").
// An address without a name is region "default". Targets keep their
// order; the same node given twice is refused.
func ParseTargets(s string) ([]Target, error) {
	var out []Target
	seen := map[Target]bool{}
	for _, part := range splitList(s) {
		region, addr, ok := strings.Cut(part, "=")
		if !ok {
			region, addr = "default", part
		}
		t := Target{Region: strings.TrimSpace(region), Addr: strings.TrimSpace(addr)}
		if t.Region == "" || t.Addr == "" {
			return nil, fmt.Errorf("target %q: want region=address", part)
		}
		if seen[t] {
			return nil, fmt.Errorf("target %q given twice", part)
		}
		seen[t] = true
		out = append(out, t)
	}
	if len(out) == 0 {
		return nil, errors.New("no target given")
	}
	return out, nil
}

// Weight is one region's share of the traffic in a Split.
type Weight struct {
	Region string
	Share  float64
}

// ParseSplit parses "us=0.33,eu=0.33,ap=0.34". Shares need not sum to 1;
// they are normalised.
func ParseSplit(s string) ([]Weight, error) {
	var out []Weight
	for _, part := range splitList(s) {
		region, share, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("split %q: want region=share", part)
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(share), 64)
		if err != nil {
			return nil, fmt.Errorf("split %q: %w", part, err)
		}
		out = append(out, Weight{Region: strings.TrimSpace(region), Share: f})
	}
	return out, nil
}

// ParseIdeal parses an ideal limit: "100" (tokens per second) or
// "60/1h", "5/s" (tokens per period), with burst b (0 means the limit).
func ParseIdeal(rate string, burst int64) (*algorithm.Spec, error) {
	if strings.TrimSpace(rate) == "" {
		return nil, nil
	}
	lim, per, ok := strings.Cut(rate, "/")
	period := time.Second
	if ok {
		per = strings.TrimSpace(per)
		if per != "" && (per[0] < '0' || per[0] > '9') {
			per = "1" + per // "5/s" reads as 5 per 1s
		}
		d, err := time.ParseDuration(per)
		if err != nil {
			return nil, fmt.Errorf("ideal rate %q: period: %w", rate, err)
		}
		period = d
	}
	l, err := strconv.ParseInt(strings.TrimSpace(lim), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("ideal rate %q: want an integer count of tokens per period: %w", rate, err)
	}
	s := &algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: l, Period: period, Burst: burst}
	if err := checkIdeal(s); err != nil {
		return nil, err
	}
	return s, nil
}

func checkIdeal(s *algorithm.Spec) error {
	if s.Algorithm != algorithm.TokenBucket {
		return fmt.Errorf("ideal: only a token bucket can be simulated, not %v", s.Algorithm)
	}
	if s.Limit <= 0 || s.Period <= 0 || s.Burst < 0 {
		return fmt.Errorf("ideal %d/%v burst %d: want a positive limit and period and burst >= 0", s.Limit, s.Period, s.Burst)
	}
	return nil
}

// KeyField is the request field that carries the drawn key.
type KeyField uint8

// The key fields.
const (
	// Client puts key i in client_identifier as Prefix+i.
	Client KeyField = iota
	// Tenant puts key i in tenant_id as Prefix+i.
	Tenant
	// IP puts key i in ip as the i-th address after 10.0.0.0.
	IP
)

// ParseKeyField returns the field spelled s (client, tenant, ip).
func ParseKeyField(s string) (KeyField, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "client":
		return Client, nil
	case "tenant":
		return Tenant, nil
	case "ip":
		return IP, nil
	}
	return 0, fmt.Errorf("unknown key field %q (want client, tenant or ip)", s)
}

// FormatTargets is the --target form of targets, the inverse of
// ParseTargets.
func FormatTargets(targets []Target) string {
	parts := make([]string, len(targets))
	for i, t := range targets {
		parts[i] = t.Region + "=" + t.Addr
	}
	return strings.Join(parts, ",")
}

// regionsOf returns the regions of targets, each once, in the order they
// first appear: the region indexes of the split, the recorder and the
// report.
func regionsOf(targets []Target) []string {
	var out []string
	for _, t := range targets {
		if !slices.Contains(out, t.Region) {
			out = append(out, t.Region)
		}
	}
	return out
}

// Config is one load run. Zero values take the defaults noted.
type Config struct {
	// Targets are the regions' nodes; a region's share of the traffic is
	// spread evenly over its nodes, request by request.
	Targets  []Target
	Protocol Protocol
	// Rate is the open-loop target in requests per second over all
	// targets. 0 runs closed loop: Concurrency workers each send the next
	// request when the previous one is answered.
	Rate float64
	// Concurrency is the number of workers: in open loop the most requests
	// in flight (a request whose worker is busy is sent late, and its
	// latency counts from when it was due); in closed loop the load.
	// Default 64.
	Concurrency int
	// Duration bounds the run (required). MaxRequests, when > 0, bounds
	// the count too; whichever comes first stops the run.
	Duration    time.Duration
	MaxRequests int64
	// Timeout bounds each request. Default 2s.
	Timeout time.Duration

	// Keys is the key distribution; Keys.Count 0 means 1000.
	Keys     Keys
	KeyField KeyField
	// KeyPrefix prefixes key indexes for Client and Tenant. Default "k".
	KeyPrefix string
	// Template holds the other request fields (route, method, tier,
	// token_cost, and tenant or client when they are not the key field).
	// It is copied, never modified.
	Template *ratelimitv1.RateLimitRequest

	// Split is each region's share of requests; empty means even. At
	// ShiftAt (when > 0) the split becomes ShiftSplit.
	Split      []Weight
	ShiftAt    time.Duration
	ShiftSplit []Weight

	// Seed makes the choice of region and key a pure function of (Seed,
	// request index): two runs with the same seed send the same sequence.
	Seed uint64

	// Interval is the width of one time-series point. 0 picks 1s, or
	// Duration/300 for runs over five minutes.
	Interval time.Duration
	// Ideal, when set, is the limit each key should get; the report
	// compares what was admitted with a perfect token bucket per key fed
	// the same requests.
	Ideal *algorithm.Spec

	// Warmup, when > 0, is the start of the run left out of
	// Report.Measured: requests due before it are sent and counted in the
	// totals and the series (and fed to the ideal) but not measured.
	Warmup time.Duration
	// MinMeasured, in closed loop, keeps the run going past Duration
	// until this many measured requests (due from Warmup on) have been
	// answered or have failed, so that a run whose first answers came
	// late (a starved machine, a slow first connection) still measures
	// something instead of ending empty. ctx still stops it, and each
	// request is bounded by Timeout. 0 ends at Duration.
	MinMeasured int64

	// Conns is the number of gRPC connections per target. Default 1.
	Conns int
	// Dial, when set, replaces the network client for each target (the
	// sandbox and tests can check in process).
	Dial func(Target) (Checker, error)
	// Progress, when set, receives a status line while the run lasts.
	Progress io.Writer
	Logger   *slog.Logger
}

func (c *Config) defaults() {
	if c.Concurrency <= 0 {
		c.Concurrency = 64
	}
	if c.Timeout <= 0 {
		c.Timeout = 2 * time.Second
	}
	if c.Keys.Count == 0 {
		c.Keys.Count = 1000
	}
	if c.KeyPrefix == "" {
		c.KeyPrefix = "k"
	}
	if c.Conns <= 0 {
		c.Conns = 1
	}
	if c.Interval <= 0 {
		c.Interval = time.Second
		if c.Duration > 5*time.Minute {
			c.Interval = (c.Duration / 300).Truncate(time.Second)
		}
	}
	if c.Template == nil {
		c.Template = &ratelimitv1.RateLimitRequest{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

func (c *Config) validate() error {
	var errs []error
	if len(c.Targets) == 0 {
		errs = append(errs, errors.New("no target"))
	}
	if c.Duration <= 0 {
		errs = append(errs, errors.New("duration must be positive: every run is bounded in time"))
	}
	if c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) {
		errs = append(errs, fmt.Errorf("rate %v: want a finite number >= 0", c.Rate))
	}
	if c.MaxRequests < 0 {
		errs = append(errs, fmt.Errorf("max requests %d: want >= 0", c.MaxRequests))
	}
	if c.Duration > 0 && c.Duration/c.Interval > 100_000 {
		errs = append(errs, fmt.Errorf("interval %v: more than 100000 points over %v", c.Interval, c.Duration))
	}
	if c.KeyField == IP && c.Keys.Count > 1<<24 {
		errs = append(errs, fmt.Errorf("key count %d: ip keys live in 10.0.0.0/8, at most %d", c.Keys.Count, 1<<24))
	}
	if err := c.Keys.validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Ideal != nil {
		if err := checkIdeal(c.Ideal); err != nil {
			errs = append(errs, err)
		}
	}
	if c.MinMeasured < 0 || (c.MinMeasured > 0 && c.Rate > 0) {
		errs = append(errs, fmt.Errorf("min measured %d: want >= 0, and 0 in open loop (its requests are due at fixed times)", c.MinMeasured))
	}
	if c.Warmup < 0 || (c.Duration > 0 && c.Warmup >= c.Duration) {
		errs = append(errs, fmt.Errorf("warm-up %v: want >= 0 and less than the duration %v", c.Warmup, c.Duration))
	}
	if c.ShiftAt < 0 {
		errs = append(errs, fmt.Errorf("shift at %v: want >= 0", c.ShiftAt))
	}
	if c.ShiftAt > 0 && len(c.ShiftSplit) == 0 {
		errs = append(errs, errors.New("shift time given without a split to shift to"))
	}
	return errors.Join(errs...)
}

// ipKey is the i-th address after 10.0.0.0.
func ipKey(i int) string {
	return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}).String()
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
