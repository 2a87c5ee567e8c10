package sweep

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Sample is one line of a Prometheus text exposition: a metric name, its
// label set as written between the braces (without them), and the value.
type Sample struct {
	Name   string
	Labels string
	Value  float64
}

// ParseMetrics reads a Prometheus text exposition (version 0.0.4): one
// sample per line, "#" lines and blank lines skipped, an optional
// timestamp after the value ignored. A line it cannot read is an error
// naming the line.
func ParseMetrics(r io.Reader) ([]Sample, error) {
	var out []Sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		s, err := parseSample(line)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d %.80q: %w", n, line, err)
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	return out, nil
}

func parseSample(line string) (Sample, error) {
	var s Sample
	rest := line
	if i := strings.IndexAny(line, "{ \t"); i < 0 {
		return s, fmt.Errorf("no value")
	} else {
		s.Name, rest = line[:i], line[i:]
	}
	if s.Name == "" {
		return s, fmt.Errorf("no metric name")
	}
	if rest[0] == '{' {
		end, err := labelsEnd(rest)
		if err != nil {
			return s, err
		}
		s.Labels, rest = rest[1:end], rest[end+1:]
	}
	f := strings.Fields(rest)
	if len(f) == 0 || len(f) > 2 {
		return s, fmt.Errorf("want a value and an optional timestamp after the name")
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return s, fmt.Errorf("value: %w", err)
	}
	s.Value = v
	return s, nil
}

// labelsEnd is the index of the brace closing the label set that s opens,
// skipping braces inside quoted label values.
func labelsEnd(s string) (int, error) {
	quoted := false
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++ // an escaped quote or backslash
		case c == '"':
			quoted = !quoted
		case !quoted && c == '}':
			return i, nil
		}
	}
	return 0, fmt.Errorf("label set not closed")
}

// Sum adds the values of every sample named name; found is false when
// there is none.
func Sum(samples []Sample, name string) (sum float64, found bool) {
	for _, s := range samples {
		if s.Name == name {
			sum += s.Value
			found = true
		}
	}
	return sum, found
}

// ByLabels maps each label set of the samples named name to its value.
func ByLabels(samples []Sample, name string) map[string]float64 {
	out := map[string]float64{}
	for _, s := range samples {
		if s.Name == name {
			out[s.Labels] = s.Value
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

func (b *breakerWatch) observe(samples []Sample) {
	if b.open == nil {
		b.open = map[string]bool{}
	}
	states := ByLabels(samples, "allot_breaker_state")
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
