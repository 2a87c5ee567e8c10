package sweep

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// Row is one level of the sweep: what the generator and the Redis and
// node counters saw after the warm-up.
type Row struct {
	// Server is "node" or "no-op" (the baseline).
	Server string
	Case   Case
	// Concurrency is the closed loop's workers.
	Concurrency int
	// Addr is the gRPC address the row's load went to.
	Addr string
	// Pause > 0 marks a pause row: the node was stopped for Pause once
	// every PauseEvery of the measured part.
	Pause, PauseEvery time.Duration

	Sent      int64
	Decisions float64 // answered checks per second (Sent less Failed, over the measured span)
	P50, P99  time.Duration
	P999      time.Duration
	// FailedOpen, Degraded (the response's degraded field, allowed or
	// throttled), Shed (UNAVAILABLE "overloaded") and Errors (every
	// other failed call) count answers of the measured part.
	FailedOpen, Degraded, Shed, Errors int64
	// BreakerOpenings is -1 when the node exports neither
	// allot_breaker_openings_total nor allot_breaker_state.
	BreakerOpenings int
	// Redis holds the changes of INFO over the measured part; HasRedis
	// is false for the no-op baseline.
	Redis    RedisStats
	HasRedis bool
	// Admitted is allowed plus failed open; Ideal is what the ideal
	// bucket admitted of the same requests, -1 without a real limit.
	Admitted, Ideal int64
	// RedisPauses are the events of Redis's latency monitor (1 ms
	// threshold) during the row, from LATENCY LATEST.
	RedisPauses []string
}

// StoreDecisions is the part of Decisions the store made: answers
// neither failed open nor degraded, per second.
func (r Row) StoreDecisions() float64 {
	answered := r.Sent - r.Shed - r.Errors
	if answered <= 0 {
		return 0
	}
	return r.Decisions * float64(max(0, answered-r.FailedOpen-r.Degraded)) / float64(answered)
}

// CallsPer1k is Redis script calls per 1,000 answered checks (NaN when
// unknown or nothing was answered).
func (r Row) CallsPer1k() float64 {
	answered := r.Sent - r.Shed - r.Errors
	if !r.HasRedis || answered <= 0 {
		return math.NaN()
	}
	return 1000 * float64(r.Redis.ScriptCalls) / float64(answered)
}

// UsecPerCall is Redis CPU per script call (NaN without calls).
func (r Row) UsecPerCall() float64 {
	if !r.HasRedis || r.Redis.ScriptCalls <= 0 {
		return math.NaN()
	}
	return float64(r.Redis.ScriptUsec) / float64(r.Redis.ScriptCalls)
}

// Ratio is admitted over ideal (NaN without an ideal or when it is 0).
func (r Row) Ratio() float64 {
	if r.Ideal <= 0 {
		return math.NaN()
	}
	return float64(r.Admitted) / float64(r.Ideal)
}

// columns of the table, in order.
var columns = []string{"server", "precision", "keys", "limit", "conc", "decisions/s", "p50", "p99", "p999",
	"failed_open", "degraded", "shed", "errors", "breaker_open", "redis/1k", "µs/call", "conns_opened", "admitted", "ideal", "adm/ideal"}

// WriteHeader writes the Markdown header of the rows WriteRow writes.
func WriteHeader(w io.Writer) error {
	var b strings.Builder
	b.WriteString("|")
	for _, c := range columns {
		b.WriteString(" " + c + " |")
	}
	b.WriteString("\n|")
	for i := range columns {
		if i < 4 {
			b.WriteString("---|")
		} else {
			b.WriteString("---:|")
		}
	}
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteRow writes r as one Markdown table row; "–" marks a figure that
// does not apply, "n/a" one the node does not export.
func WriteRow(w io.Writer, r Row) error {
	dash := "–"
	prec, keys, limit := r.Case.Precision, r.Case.Keys.Name, r.Case.Limit.Name
	if r.Server != "node" {
		prec, limit = dash, dash
	}
	breaker := strconv.Itoa(r.BreakerOpenings)
	if r.BreakerOpenings < 0 {
		breaker = "n/a"
	}
	if r.Server != "node" {
		breaker = dash
	}
	conns := dash
	if r.HasRedis {
		conns = strconv.FormatInt(r.Redis.Connections, 10)
	}
	ideal, ratio := dash, dash
	if r.Ideal >= 0 {
		ideal = group(r.Ideal)
		if !math.IsNaN(r.Ratio()) {
			ratio = fmt.Sprintf("%.3f", r.Ratio())
		}
	}
	server := r.Server
	if r.Pause > 0 {
		server = fmt.Sprintf("%s paused %v every %v", r.Server, r.Pause, r.PauseEvery)
	}
	cells := []string{server, prec, keys, limit, strconv.Itoa(r.Concurrency), group(int64(math.Round(r.Decisions))),
		Duration(r.P50), Duration(r.P99), Duration(r.P999),
		group(r.FailedOpen), group(r.Degraded), group(r.Shed), group(r.Errors), breaker,
		float(r.CallsPer1k(), 1), float(r.UsecPerCall(), 1), conns, group(r.Admitted), ideal, ratio}
	_, err := io.WriteString(w, "| "+strings.Join(cells, " | ")+" |\n")
	return err
}

// Duration renders a latency compactly with 3 significant digits: 87µs,
// 1.23ms, 45.6ms, 1.20s.
func Duration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0"
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d.Microseconds())
	case d < time.Second:
		return sig3(float64(d)/float64(time.Millisecond)) + "ms"
	}
	return sig3(d.Seconds()) + "s"
}

func sig3(v float64) string {
	switch {
	case v < 10:
		return strconv.FormatFloat(v, 'f', 2, 64)
	case v < 100:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

func float(v float64, prec int) string {
	if math.IsNaN(v) {
		return "–"
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}

// group renders n with thousands separators: 12,345.
func group(n int64) string { return message.NewPrinter(language.English).Sprintf("%d", n) }

// MaxConcurrency bounds one level: a closed loop's workers are goroutines
// and requests in flight on two cores.
const MaxConcurrency = 4096

// ParseLevels parses a comma-separated list of closed-loop concurrencies,
// e.g. "1,4,16,64,256": each an integer in [1, MaxConcurrency], none
// twice, at least one.
func ParseLevels(s string) ([]int, error) {
	var out []int
	seen := map[int]bool{}
	for p := range strings.SplitSeq(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		n, err := strconv.Atoi(p)
		if err != nil {
			return nil, fmt.Errorf("level %q: want an integer", p)
		}
		if n < 1 || n > MaxConcurrency {
			return nil, fmt.Errorf("level %d: want 1..%d", n, MaxConcurrency)
		}
		if seen[n] {
			return nil, fmt.Errorf("level %d given twice", n)
		}
		seen[n] = true
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no level in %q", s)
	}
	return out, nil
}
