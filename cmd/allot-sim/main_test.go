package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// capture runs the command with args and returns what it printed.
func capture(t *testing.T, args ...string) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	done := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(r)
		done <- b
	}()
	err = run(args)
	os.Stdout = old
	_ = w.Close()
	out := <-done
	if err != nil {
		t.Fatalf("allot-sim %v: %v", args, err)
	}
	return string(out)
}

// The last line is the JSON the issue asks for, a run is repeatable, and
// --png writes a PNG.
func TestLastLineIsJSON(t *testing.T) {
	png := filepath.Join(t.TempDir(), "sim.png")
	args := []string{"--duration", "20s", "--keys", "100", "--nodes", "3", "--shift-at", "10s", "--shift-to", "0.9,0.05,0.05",
		"--crash", "0/1@5s", "--partition", "2@3s-8s,0>1@9s-11s,1<>2@12s-13s,*>0@14s-15s", "--failover", "1@12s:100ms", "--png", png,
		"--jitter", "node=1ms,coord=2ms,region=30ms", "--loss", "drop=0.05,dup=0.05,reorder=0.1,hold=50ms", "--skew", "redis=200ms,node=50ms,coord=1s",
		"--redis-outage", "0@11s-13s", "--on-store-failure", "local", "--restart", "1/2@6s-9s", "--join", "2@7s", "--coord-overlap", "1@10s-14s",
		"--away", "300ms/1s@10s-18s"}
	out := capture(t, args...)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &m); err != nil {
		t.Fatalf("last line %q: %v", lines[len(lines)-1], err)
	}
	for _, k := range []string{"admitted_over_ideal", "max_overshoot_over_bound", "converged_after_s", "underserved_region_seconds",
		"outside_open", "outside_local", "max_overshoot_with_outside", "restarts", "messages_dropped", "past_ttl_admissions",
		"lease_calls", "keys_leased", "exact_calls", "intervals"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON has no %s", k)
		}
	}
	if again := capture(t, args...); again != out {
		t.Error("two runs printed different output")
	}
	b, err := os.ReadFile(png)
	if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Errorf("png: %v, %d bytes", err, len(b))
	}
}

func TestBadFlagsFail(t *testing.T) {
	for _, args := range [][]string{
		{"--dist", "pareto"},
		{"--regions", "3", "--shift-at", "5s"},
		{"--crash", "7/0@1s"},
		{"--partition", "1@5s"},
		{"--failover", "1@5s"},
		{"--partition", "1>@5s-6s"},
		{"--partition", "1<>1@5s-6s"},
		{"--jitter", "wan=5ms"},
		{"--loss", "drop=1"},
		{"--skew", "-5ms"},
		{"--redis-outage", "1@5s"},
		{"--on-store-failure", "maybe"},
		{"--restart", "0/9@5s-6s"},
		{"--restart", "0/1@6s-5s"},
		{"--join", "5@5s"},
		{"--coord-overlap", "0@5s"},
		{"--away", "300ms"},
		{"--away", "2s/1s"},
		{"--away", "300ms/1s@5s-4s"},
	} {
		if err := run(args); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
