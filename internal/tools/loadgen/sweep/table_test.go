package sweep

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/policy"
)

func TestParseLevels(t *testing.T) {
	got, err := ParseLevels(" 1, 4,16 ,64,256,")
	if err != nil {
		t.Fatal(err)
	}
	want := []int{1, 4, 16, 64, 256}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	for _, bad := range []string{"", ",", "0", "-4", "1,x", "1.5", "4,4", "5000"} {
		if l, err := ParseLevels(bad); err == nil {
			t.Errorf("ParseLevels(%q) = %v, want an error", bad, l)
		}
	}
}

func TestDurationAndGroup(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0", 87 * time.Microsecond: "87µs", 1234 * time.Microsecond: "1.23ms", 45600 * time.Microsecond: "45.6ms",
		312 * time.Millisecond: "312ms", 1200 * time.Millisecond: "1.20s",
	} {
		if got := Duration(d); got != want {
			t.Errorf("Duration(%v) = %q, want %q", d, got, want)
		}
	}
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -12345: "-12,345"} {
		if got := group(n); got != want {
			t.Errorf("group(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestWriteRow(t *testing.T) {
	var b bytes.Buffer
	if err := WriteHeader(&b); err != nil {
		t.Fatal(err)
	}
	node := Row{Server: "node", Case: Case{Precision: "exact", Keys: HotKey, Limit: RealLimit}, Concurrency: 16,
		Sent: 12000, Decisions: 3999.6, P50: 870 * time.Microsecond, P99: 4560 * time.Microsecond, P999: 12 * time.Millisecond,
		FailedOpen: 3, Degraded: 2, Shed: 5, Errors: 1, BreakerOpenings: 1,
		Redis: RedisStats{ScriptCalls: 11994, ScriptUsec: 11994 * 38, Connections: 7}, HasRedis: true,
		Admitted: 3950, Ideal: 4000}
	noop := Row{Server: "no-op", Case: Case{Keys: Uniform10k}, Concurrency: 32, Sent: 60000, Decisions: 20000,
		BreakerOpenings: -1, Admitted: 60000, Ideal: -1}
	unknown := node
	unknown.BreakerOpenings = -1
	for _, r := range []Row{node, noop, unknown} {
		if err := WriteRow(&b, r); err != nil {
			t.Fatal(err)
		}
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("%d lines, want header, rule and 3 rows:\n%s", len(lines), b.String())
	}
	cells := func(line string) []string {
		f := strings.Split(strings.Trim(line, "|"), "|")
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		return f
	}
	head := cells(lines[0])
	if len(head) != len(columns) || head[5] != "decisions/s" {
		t.Fatalf("header %q", head)
	}
	for i, line := range lines[1:] {
		if n := len(cells(line)); n != len(columns) {
			t.Errorf("line %d has %d cells, want %d: %s", i+1, n, len(columns), line)
		}
	}
	// 11994 calls for 12000 - 5 shed - 1 error answered = 11994: 1000.0 per 1,000.
	want := []string{"node", "exact", "hot", "real", "16", "4,000", "870µs", "4.56ms", "12.0ms", "3", "2", "5", "1", "1",
		"1000.0", "38.0", "7", "3,950", "4,000", "0.988"}
	if got := cells(lines[2]); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("node row\n got %q\nwant %q", got, want)
	}
	want = []string{"no-op", "–", "uniform", "–", "32", "20,000", "0", "0", "0", "0", "0", "0", "0", "–", "–", "–", "–", "60,000", "–", "–"}
	if got := cells(lines[3]); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("no-op row\n got %q\nwant %q", got, want)
	}
	if got := cells(lines[4]); got[13] != "n/a" {
		t.Errorf("breaker cell %q, want n/a when the node exports nothing to count by", got[13])
	}
}

func TestRowRatiosWithoutData(t *testing.T) {
	r := Row{Ideal: -1}
	if !math.IsNaN(r.CallsPer1k()) || !math.IsNaN(r.UsecPerCall()) || !math.IsNaN(r.Ratio()) {
		t.Fatalf("a row without Redis figures or ideal gave %v %v %v, want NaN", r.CallsPer1k(), r.UsecPerCall(), r.Ratio())
	}
	r = Row{HasRedis: true, Sent: 10, Errors: 10, Redis: RedisStats{ScriptCalls: 3}}
	if !math.IsNaN(r.CallsPer1k()) {
		t.Fatalf("nothing answered: calls per 1,000 = %v, want NaN", r.CallsPer1k())
	}
}

func TestBaselineRatio(t *testing.T) {
	rows := []Row{
		{Server: "no-op", Concurrency: 32, Decisions: 20000, Sent: 60000},
		// A quarter of the answers failed open or were degraded, and
		// 1,000 calls got no answer.
		{Server: "node", Concurrency: 32, Decisions: 12000, Sent: 37000, FailedOpen: 8000, Degraded: 1000, Shed: 600, Errors: 400},
		{Server: "node", Concurrency: 1, Decisions: 100},
	}
	if all, byStore, ok := BaselineRatio(rows); !ok || all != 0.6 || byStore != 0.45 {
		t.Fatalf("ratio %v, by store %v, %v; want 0.6 and 0.45", all, byStore, ok)
	}
	if _, _, ok := BaselineRatio(rows[1:]); ok {
		t.Fatal("a ratio without a no-op row")
	}
}

// The policy file a case writes is one the node accepts, with the
// case's precision and limit.
func TestCasePolicyLoads(t *testing.T) {
	for _, c := range Cases(Precisions, []KeySet{Uniform10k, HotKey}, []Limit{HugeLimit, RealLimit}) {
		set, err := policy.Load("sweep.yaml", []byte(c.policy()))
		if err != nil {
			t.Fatalf("%s: %v\n%s", c, err, c.policy())
		}
		n := 0
		set.Each(func(p *policy.Compiled) {
			n++
			if !strings.Contains(c.policy(), "precision: "+c.Precision) || len(p.Limits) != 1 {
				t.Errorf("%s: policy %+v", c, p)
			}
		})
		if n != 1 {
			t.Errorf("%s: %d policies, want 1", c, n)
		}
	}
	if got := len(Cases(Precisions, []KeySet{Uniform10k, HotKey}, []Limit{HugeLimit, RealLimit})); got != 8 {
		t.Fatalf("%d cases, want 2 x 2 x 2", got)
	}
}
