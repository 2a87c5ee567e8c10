package sweep

import (
	"strings"
	"testing"

	"github.com/allot-dev/allot/internal/testenv/promtext"
)

// An excerpt of a node's /metrics (OpenTelemetry's Prometheus exporter).
const exposition = `# HELP allot_breaker_state Circuit breaker of each region Redis shard: 0 closed, 1 half-open, 2 open.
# TYPE allot_breaker_state gauge
allot_breaker_state{otel_scope_name="allot",shard="127.0.0.1:7000"} 2
allot_breaker_state{otel_scope_name="allot",shard="127.0.0.1:7001"} 0
# TYPE allot_breaker_openings_total counter
allot_breaker_openings_total{shard="127.0.0.1:7000"} 3
allot_breaker_openings_total{shard="127.0.0.1:7001"} 1 1700000000000
allot_decisions_total{outcome="allowed",policy="we{ird} \"quoted\""} 1.5e+06

target_info{service_name="allot-node"} 1
`

// The sweep reads what expfmt parses of a node's exposition: counters
// summed over their series, gauges by label set, whatever the label
// values hold.
func TestSumAndByLabels(t *testing.T) {
	fams, err := promtext.Parse(strings.NewReader(exposition))
	if err != nil {
		t.Fatal(err)
	}
	series := 0
	for _, f := range fams {
		series += len(f.GetMetric())
	}
	if series != 6 {
		t.Fatalf("%d series, want 6: %v", series, fams)
	}
	if v, ok := Sum(fams, "allot_breaker_openings_total"); !ok || v != 4 {
		t.Errorf("openings %v %v, want 4", v, ok)
	}
	if _, ok := Sum(fams, "allot_lease_refills_total"); ok {
		t.Error("found a metric that is not there")
	}
	if v, _ := Sum(fams, "allot_decisions_total"); v != 1.5e6 {
		t.Errorf("decisions %v: a brace inside a quoted label value ended the label set", v)
	}
	states := ByLabels(fams, "allot_breaker_state")
	if len(states) != 2 || states[`otel_scope_name="allot",shard="127.0.0.1:7000"`] != 2 {
		t.Errorf("states %v", states)
	}
	if got := ByLabels(fams, "allot_decisions_total"); got[`outcome="allowed",policy="we{ird} \"quoted\""`] != 1.5e6 {
		t.Errorf("decisions by labels %v", got)
	}
	for _, bad := range []string{"allot_x", "allot_x{a=\"b\" 1", "allot_x{} one", "{a=\"b\"} 1", "allot_x 1 2 3"} {
		if _, err := promtext.Parse(strings.NewReader(bad + "\n")); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestBreakerWatchCountsOpenings(t *testing.T) {
	gauge := func(states ...string) map[string]float64 {
		out := map[string]float64{}
		for i, st := range states {
			if st == "" {
				continue // this shard's series is absent
			}
			out[`shard="s`+string(rune('0'+i))+`"`] = map[string]float64{"closed": 0, "half": 1, "open": 2}[st]
		}
		return out
	}
	var w breakerWatch
	for _, scrape := range [][]string{
		{"open", "closed"},   // s0 open at the start: one opening
		{"open", "closed"},   // still the same opening
		{"half", "open"},     // s1 opens
		{"open", "open"},     // s0 re-opens after its probe failed
		{"closed", ""},       // s1's series vanished: not open any more
		{"closed", "open"},   // s1 opens again
		{"closed", "closed"}, // all closed
	} {
		w.observe(gauge(scrape...))
	}
	if w.openings != 4 {
		t.Fatalf("%d openings, want 4", w.openings)
	}
}

// The INFO reply of Redis 7 with the commandstats and stats sections.
const info = `# Commandstats
cmdstat_evalsha:calls=1200,usec=45600,usec_per_call=38.00,rejected_calls=0,failed_calls=1
cmdstat_eval:calls=3,usec=1614,usec_per_call=538.00,rejected_calls=0,failed_calls=0
cmdstat_fcall:calls=10,usec=100,usec_per_call=10.00,rejected_calls=0,failed_calls=0
cmdstat_hset:calls=99,usec=5,usec_per_call=0.05,rejected_calls=0,failed_calls=0
cmdstat_info:calls=7,usec=70,usec_per_call=10.00,rejected_calls=0,failed_calls=0

# Stats
total_connections_received:42
total_commands_processed:1319
`

func TestParseRedisStats(t *testing.T) {
	st, err := ParseRedisStats(strings.ReplaceAll(info, "\n", "\r\n")) // Redis ends lines with CRLF
	if err != nil {
		t.Fatal(err)
	}
	if want := (RedisStats{ScriptCalls: 1213, ScriptUsec: 47314, Connections: 42}); st != want {
		t.Fatalf("got %+v, want %+v", st, want)
	}
	d := st.Sub(RedisStats{ScriptCalls: 13, ScriptUsec: 314, Connections: 40})
	if d != (RedisStats{ScriptCalls: 1200, ScriptUsec: 47000, Connections: 2}) {
		t.Fatalf("delta %+v", d)
	}
	if _, err := ParseRedisStats("# Commandstats\ncmdstat_evalsha:calls=1\n"); err == nil {
		t.Error("INFO without the stats section accepted")
	}
	if _, err := ParseRedisStats("total_connections_received:1\ncmdstat_evalsha:calls=x,usec=1\n"); err == nil {
		t.Error("a bad calls= figure accepted")
	}
}
