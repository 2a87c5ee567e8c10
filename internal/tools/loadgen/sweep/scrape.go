package sweep

import (
	"fmt"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"

	"github.com/allot-dev/allot/internal/testenv/promtext"
)

// Sum adds the values of every series of the family name (promtext.Value:
// a counter's, gauge's or untyped metric's, a histogram's count); found is
// false when fams has no such series.
func Sum(fams map[string]*dto.MetricFamily, name string) (sum float64, found bool) {
	for _, m := range fams[name].GetMetric() {
		if v, ok := promtext.Value(m); ok {
			sum += v
			found = true
		}
	}
	return sum, found
}

// ByLabels maps each label set of the family name's series
// (promtext.Labels) to its value.
func ByLabels(fams map[string]*dto.MetricFamily, name string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range fams[name].GetMetric() {
		if v, ok := promtext.Value(m); ok {
			out[promtext.Labels(m)] = v
		}
	}
	return out
}

// ParseInfo reads the reply of Redis INFO: "field:value" lines under
// "# Section" headers, into one map (field names are unique across
// sections).
func ParseInfo(text string) map[string]string {
	out := map[string]string{}
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = v
		}
	}
	return out
}

// scriptCommands are the INFO commandstats entries of script calls: the
// node's scripts run by EVALSHA (EVAL on a cache miss) or, as Redis
// Functions, by FCALL; the read-only variants are counted alike.
var scriptCommands = []string{"evalsha", "evalsha_ro", "eval", "eval_ro", "fcall", "fcall_ro"}

// RedisStats are the figures a sweep reads from INFO.
type RedisStats struct {
	// ScriptCalls and ScriptUsec sum calls= and usec= of the script
	// commands in commandstats.
	ScriptCalls, ScriptUsec int64
	// Connections is total_connections_received (INFO stats).
	Connections int64
}

// ParseRedisStats extracts RedisStats from an INFO reply holding the
// commandstats and stats sections.
func ParseRedisStats(text string) (RedisStats, error) {
	info := ParseInfo(text)
	var st RedisStats
	conns, ok := info["total_connections_received"]
	if !ok {
		return st, fmt.Errorf("INFO has no total_connections_received (stats section missing)")
	}
	var err error
	if st.Connections, err = strconv.ParseInt(conns, 10, 64); err != nil {
		return st, fmt.Errorf("total_connections_received %q: %w", conns, err)
	}
	for _, c := range scriptCommands {
		v, ok := info["cmdstat_"+c]
		if !ok {
			continue
		}
		for kv := range strings.SplitSeq(v, ",") {
			k, n, _ := strings.Cut(kv, "=")
			var dst *int64
			switch k {
			case "calls":
				dst = &st.ScriptCalls
			case "usec":
				dst = &st.ScriptUsec
			default:
				continue
			}
			i, err := strconv.ParseInt(n, 10, 64)
			if err != nil {
				return st, fmt.Errorf("cmdstat_%s %s: %w", c, kv, err)
			}
			*dst += i
		}
	}
	return st, nil
}

// Sub is the change from before to s.
func (s RedisStats) Sub(before RedisStats) RedisStats {
	return RedisStats{ScriptCalls: s.ScriptCalls - before.ScriptCalls, ScriptUsec: s.ScriptUsec - before.ScriptUsec,
		Connections: s.Connections - before.Connections}
}

// breakerOpen is the value of allot_breaker_state for an open breaker
// (telemetry.ObserveBreakers: 0 closed, 1 half-open, 2 open).
const breakerOpen = 2

// breakerWatch counts breaker openings from successive scrapes of
// allot_breaker_state, per label set (one per shard): a shard seen open
// after being seen not open (or not seen) is one opening. Scrapes far
// apart can miss a breaker that opened and closed in between; when the
// node exports allot_breaker_openings_total the sweep uses that instead.
type breakerWatch struct {
	open     map[string]bool
	openings int
}

// observe takes one scrape's allot_breaker_state by label set (ByLabels).
func (b *breakerWatch) observe(states map[string]float64) {
	if b.open == nil {
		b.open = map[string]bool{}
	}
	for shard, v := range states {
		isOpen := v == breakerOpen
		if isOpen && !b.open[shard] {
			b.openings++
		}
		b.open[shard] = isOpen
	}
	// A shard whose gauge vanished (the exporter forgets idle series)
	// is not open any more as far as the watch can tell.
	for shard := range b.open {
		if _, ok := states[shard]; !ok {
			b.open[shard] = false
		}
	}
}
