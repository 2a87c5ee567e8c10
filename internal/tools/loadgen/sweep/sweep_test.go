package sweep

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/testenv/redistest"
)

// buildBinaries builds allot-node and allot-load into a temporary
// directory with the go command that runs the test.
func buildBinaries(t *testing.T) (node, load string) {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command on PATH to build allot-node and allot-load with: %v", err)
	}
	dir := t.TempDir()
	node, load = filepath.Join(dir, "allot-node"), filepath.Join(dir, "allot-load")
	for bin, pkg := range map[string]string{node: "github.com/allot-dev/allot/cmd/node", load: "github.com/allot-dev/allot/cmd/allot-load"} {
		out, err := exec.CommandContext(t.Context(), goBin, "build", "-o", bin, pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return node, load
}

// testNodeArgs give the node a stall threshold (49 ms) over the Redis
// tail of a shared test machine (silences of up to 10 ms from a healthy
// Redis; docs/performance.md, "Machine") and under the pauses these tests
// inflict (250 ms): what they check is the node, not the host.
var testNodeArgs = []string{"--redis-timeout", "50ms"}

// refused waits (bounded) until nothing listens on addr any more.
func refused(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatalf("%s still accepts connections after the sweep returned", addr)
		}
		time.Sleep(20 * time.Millisecond) // polling a port the sweep's children held
	}
}

// A tiny sweep with the real binaries: the no-op baseline, the exact
// baseline and one level of one case, each a process of its own on a
// real redis-server; then a sweep cancelled mid-row. Both leave nothing
// listening.
func TestSweepRunsRealProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds allot-node and allot-load and runs them")
	}
	redistest.Require(t)
	nodeBin, loadBin := buildBinaries(t)
	var table bytes.Buffer
	rows, err := Run(t.Context(), Config{
		NodeBin: nodeBin, LoadBin: loadBin, Baseline: 2, Levels: []int{4},
		Cases:  []Case{{Precision: "exact", Keys: HotKey, Limit: RealLimit}},
		Warmup: 100 * time.Millisecond, Measure: 400 * time.Millisecond, Rows: &table, Dir: t.TempDir(),
	})
	t.Log("\n" + table.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || rows[0].Server != "no-op" || rows[1].Server != "node" || rows[1].Case.Precision != "exact" ||
		rows[1].Concurrency != 2 || rows[2].Case.Keys.Name != "hot" || rows[2].Concurrency != 4 {
		t.Fatalf("rows %+v, want the no-op and exact baselines at 2, then exact/hot/real at 4", rows)
	}
	if n := strings.Count(table.String(), "\n"); n != 5 {
		t.Errorf("table has %d lines, want header, rule and 3 rows", n)
	}
	for _, r := range rows {
		if r.Sent == 0 || r.Decisions <= 0 || r.P50 <= 0 || r.P99 < r.P50 {
			t.Errorf("%s %s: sent %d, %v/s, p50 %v p99 %v", r.Server, r.Case, r.Sent, r.Decisions, r.P50, r.P99)
		}
		refused(t, r.Addr)
	}
	if rows[0].HasRedis || rows[0].Admitted != rows[0].Sent {
		t.Errorf("no-op row %+v: want every call allowed and no Redis figures", rows[0])
	}
	for _, r := range rows[1:] {
		// Every decision of an exact policy on a fresh node asks Redis.
		if !r.HasRedis || r.Redis.ScriptCalls <= 0 || r.BreakerOpenings < 0 {
			t.Errorf("%s: redis %+v, breaker openings %d: want script calls and a breaker gauge", r.Case, r.Redis, r.BreakerOpenings)
		}
	}
	hot := rows[2]
	if hot.Ideal <= 0 || hot.Admitted > hot.Sent {
		t.Errorf("hot row: admitted %d of %d, ideal %d", hot.Admitted, hot.Sent, hot.Ideal)
	}
	if rows[1].Ideal != -1 {
		t.Errorf("huge limit compared with an ideal (%d)", rows[1].Ideal)
	}

	// The ratio mode on the same binaries: one pair on Redis, one
	// standalone (no redis-server, so no Redis CPU).
	for _, mode := range []string{RatioExact, RatioStandalone} {
		var out bytes.Buffer
		pairs, err := Ratio(t.Context(), RatioConfig{
			NodeBin: nodeBin, NodeArgs: testNodeArgs, LoadBin: loadBin, Mode: mode, Pairs: 1, Concurrency: 4,
			Measure: time.Second, Warmup: 200 * time.Millisecond, Out: &out, Dir: t.TempDir(),
		})
		t.Logf("ratio %s:\n%s", mode, out.String())
		if err != nil {
			t.Fatalf("ratio %s: %v", mode, err)
		}
		if len(pairs) != 1 || pairs[0].Noop <= 0 || pairs[0].Node <= 0 {
			t.Fatalf("ratio %s: pairs %+v, want one with both rates", mode, pairs)
		}
		if runtime.GOOS == "linux" {
			p := pairs[0]
			// About a second of load: tens of milliseconds of CPU each.
			if p.NodeCPU <= 0 || p.NoopCPU <= 0 || (p.RedisCPU > 0) != (mode == RatioExact) {
				t.Errorf("ratio %s: CPU per call node %v, redis %v, no-op %v", mode, p.NodeCPU, p.RedisCPU, p.NoopCPU)
			}
			// The generator is this test process: it worked in both runs.
			if p.GenNoopCPU <= 0 || p.GenNodeCPU <= 0 {
				t.Errorf("ratio %s: generator CPU per call %v (no-op run), %v (node run)", mode, p.GenNoopCPU, p.GenNodeCPU)
			}
			if p.IdleNoop < 0 || p.IdleNoop > 1 || p.IdleNode < 0 || p.IdleNode > 1 || p.StealNode < 0 || p.StealNode > 1 {
				t.Errorf("ratio %s: machine idle %v / %v, steal %v: want fractions", mode, p.IdleNoop, p.IdleNode, p.StealNode)
			}
		}
		if n := strings.Count(out.String(), "\n"); n != 3 {
			t.Errorf("ratio %s: %d lines, want the header, the pair and the summary", mode, n)
		}
	}

	// Cancelled mid-row (a 30 s row): Run returns with the context's
	// error and stops the node.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	started := make(chan string, 1)
	done := make(chan error, 1)
	go func() { // owned: ends when Run returns, which the test waits for
		_, err := Run(ctx, Config{
			NodeBin: nodeBin, Levels: []int{2}, Cases: []Case{{Precision: "leased", Keys: Uniform10k, Limit: HugeLimit}},
			Warmup: 100 * time.Millisecond, Measure: 30 * time.Second, Dir: t.TempDir(),
			Logger: slog.New(rowHandler{started}),
		})
		done <- err
	}()
	var addr string
	select {
	case addr = <-started:
	case err := <-done:
		t.Fatalf("the sweep ended before its row started: %v", err)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled sweep returned %v, want context.Canceled", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("cancelled sweep still running after 20 s")
	}
	refused(t, addr)
}

// rowHandler passes the node address of the first "row" record on.
type rowHandler struct{ rows chan<- string }

func (h rowHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h rowHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h rowHandler) WithGroup(string) slog.Handler            { return h }
func (h rowHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "row" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "node" {
			select {
			case h.rows <- a.Value.String():
			default:
			}
		}
		return true
	})
	return nil
}

// The node's own pauses are never Redis's fault (issue 34, point 6): a
// node stopped (SIGSTOP) for 250 ms once a second while it carries 32
// checks in flight on a healthy Redis, as CFS throttling stops it,
// answers them late: no FAILED_OPEN, no degraded answer, no breaker
// opening, no check lost. Redis has a CPU of its own, as in the sweep.
func TestPausedNodeIsNotRedisFault(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds allot-node and runs it")
	}
	redistest.Require(t)
	nodeBin, _ := buildBinaries(t)
	const pause = 250 * time.Millisecond
	var table bytes.Buffer
	rows, err := Run(t.Context(), Config{
		NodeBin: nodeBin, NodeArgs: testNodeArgs,
		Cases: []Case{
			{Precision: "exact", Keys: Uniform10k, Limit: HugeLimit},
			{Precision: "leased", Keys: HotKey, Limit: RealLimit},
		},
		Pauses: []time.Duration{pause}, PauseLevel: 32, PauseEvery: time.Second,
		Warmup: 300 * time.Millisecond, Measure: 2 * time.Second, Rows: &table, Dir: t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(testLog{t}, nil)),
	})
	t.Log("\n" + table.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 {
		t.Fatalf("%d rows, want one per case", len(rows))
	}
	for _, r := range rows {
		if r.Pause != pause || r.Concurrency != 32 {
			t.Errorf("%s: pause %v at %d in flight, want %v at 32", r.Case, r.Pause, r.Concurrency, pause)
		}
		if r.FailedOpen != 0 || r.Degraded != 0 || r.BreakerOpenings != 0 || r.Errors != 0 || r.Shed != 0 {
			t.Errorf("%s, node paused %v: failed open %d, degraded %d, breaker openings %d, errors %d, shed %d; want all 0",
				r.Case, pause, r.FailedOpen, r.Degraded, r.BreakerOpenings, r.Errors, r.Shed)
		}
		// Two pauses of 32 checks in about 2 s of them: the slowest
		// thousandth waited through a pause.
		if r.Sent == 0 || r.P999 < pause/2 {
			t.Errorf("%s: %d sent, p99.9 %v: the pauses did not show", r.Case, r.Sent, r.P999)
		}
	}
}

// testLog writes each log line to t.Log.
type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
