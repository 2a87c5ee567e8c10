package sweep

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	// Field 2 is the command name in parentheses, which may hold spaces
	// and parentheses of its own; utime and stime are fields 14 and 15.
	line := "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0 1000 1 1 1\n"
	got, err := parseStatCPU(line)
	if err != nil || got != 325*time.Second/clockTicks {
		t.Fatalf("parseStatCPU = %v, %v; want 3.25s (325 ticks)", got, err)
	}
	for _, bad := range []string{
		"",
		"4242 no parenthesis S 1",
		"4242 (short) S 1 2 3",
		"4242 (neg) S 1 4242 4242 0 -1 4194560 100 0 0 0 -5 75 0",
		"4242 (word) S 1 4242 4242 0 -1 4194560 100 0 0 0 x 75 0",
	} {
		if _, err := parseStatCPU(bad); err == nil {
			t.Errorf("parseStatCPU(%q) accepted", bad)
		}
	}
}

func TestParseProcStat(t *testing.T) {
	a, err := parseProcStat("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8\n")
	if err != nil || a != (cpuTimes{total: 1000, idle: 850, steal: 0}) {
		t.Fatalf("parseProcStat = %+v, %v", a, err)
	}
	b, err := parseProcStat("cpu  350 0 100 900 50 0 0 100 0 0\n")
	if err != nil {
		t.Fatal(err)
	}
	idle, steal := a.share(b)
	if idle != 0.2 || steal != 0.2 { // 500 ticks: 100 idle, 100 steal
		t.Errorf("share = %v, %v; want 0.2, 0.2", idle, steal)
	}
	if idle, steal := b.share(a); idle != 0 || steal != 0 {
		t.Errorf("share backwards = %v, %v; want 0, 0", idle, steal)
	}
	if idle, steal := (cpuTimes{}).share(b); idle != 0 || steal != 0 {
		t.Errorf("share from an unread start = %v, %v; want 0, 0 (not since boot)", idle, steal)
	}
	for _, bad := range []string{"", "intr 1 2 3", "cpu 1 2 3", "cpu 1 2 3 x 5 6 7 8"} {
		if _, err := parseProcStat(bad); err == nil {
			t.Errorf("parseProcStat(%q) accepted", bad)
		}
	}
}

func TestParseLoadAverage(t *testing.T) {
	if got := parseLoadAverage("2.42 0.96 0.36 2/159 11802\n"); got != 2.42 {
		t.Errorf("got %v, want 2.42", got)
	}
	for _, bad := range []string{"", "x 1 2"} {
		if got := parseLoadAverage(bad); got != 0 {
			t.Errorf("parseLoadAverage(%q) = %v, want 0", bad, got)
		}
	}
}

func TestParseIOSyscalls(t *testing.T) {
	io := "rchar: 1290\nwchar: 34\nsyscr: 17\nsyscw: 5\nread_bytes: 0\nwrite_bytes: 0\ncancelled_write_bytes: 0\n"
	if n, err := parseIOSyscalls(io); err != nil || n != 22 {
		t.Errorf("parseIOSyscalls = %d, %v; want 22", n, err)
	}
	for _, bad := range []string{"", "syscr: 3\n", "syscr: x\nsyscw: 1\n", "syscr: -1\nsyscw: 1\n"} {
		if _, err := parseIOSyscalls(bad); err == nil {
			t.Errorf("parseIOSyscalls(%q) accepted", bad)
		}
	}
}

func TestSummarizeAndLines(t *testing.T) {
	pairs := []Pair{
		{Noop: 40000, Node: 20000, NodeCPU: 36 * time.Microsecond, RedisCPU: 17 * time.Microsecond, NoopCPU: 21 * time.Microsecond,
			GenNoopCPU: 30 * time.Microsecond, GenNodeCPU: 35500 * time.Nanosecond, IdleNoop: 0.05, IdleNode: 0.204, StealNode: 0.01, Load: 2.5,
			NodeSys: 0.5, NoopSys: 0.25, GenNoopSys: 0.3, GenNodeSys: 1.4},
		{Noop: 30000, Node: 21000},
		{Noop: 0, Node: 1}, // a no-op that answered nothing has no ratio
	}
	mean, lo, hi := Summarize(pairs[:2])
	if lo != 0.5 || hi != 0.7 || mean < 0.5999 || mean > 0.6001 {
		t.Errorf("Summarize = %v, %v, %v; want 0.6, 0.5, 0.7", mean, lo, hi)
	}
	if r := pairs[2].Ratio(); r != 0 {
		t.Errorf("ratio over a zero no-op rate = %v, want 0", r)
	}
	var b bytes.Buffer
	if err := WritePair(&b, 1, pairs[0]); err != nil {
		t.Fatal(err)
	}
	if err := WriteSummary(&b, pairs[:2]); err != nil {
		t.Fatal(err)
	}
	want := "1: no-op 40000/s, node 20000/s, ratio 0.500; CPU per call: node 36.0 µs, redis 17.0 µs, no-op 21.0 µs, " +
		"generator 30.0 µs (no-op run) / 35.5 µs (node run); syscalls per call: node 0.50, no-op 0.25, generator 0.30 / 1.40; machine idle 5 % / 20 %, steal 1 % (load 2.50)\n" +
		"ratio mean 0.600, range 0.500-0.700 over 2 pairs\n"
	if b.String() != want {
		t.Errorf("lines:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestRatioConfigRefusals(t *testing.T) {
	for _, c := range []struct {
		cfg  RatioConfig
		want string
	}{
		{RatioConfig{LoadBin: "l", Mode: RatioExact}, "binary"},
		{RatioConfig{NodeBin: "n", LoadBin: "l", Mode: "zipf"}, "mode"},
		{RatioConfig{NodeBin: "n", LoadBin: "l", Mode: RatioExact, Pairs: -1}, "pairs"},
		{RatioConfig{NodeBin: "n", LoadBin: "l", Mode: RatioExact, Concurrency: MaxConcurrency + 1}, "concurrency"},
		{RatioConfig{NodeBin: "n", LoadBin: "l", Mode: RatioExact, Measure: -time.Second}, "measure"},
	} {
		_, err := Ratio(t.Context(), c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one about %s", c.cfg, err, c.want)
		}
	}
}
