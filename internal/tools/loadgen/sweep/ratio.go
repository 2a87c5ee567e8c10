package sweep

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/allot-dev/allot/internal/testenv/redisproc"
)

// Ratio modes: what the node is compared with the no-op server on.
const (
	// RatioExact is 10,000 tenants, a huge limit, precision exact, on
	// Redis: every decision a script call (issue 12's exact / no-op).
	RatioExact = "exact"
	// RatioLeased is one hot tenant, a huge limit, precision leased, on
	// Redis: decisions from the node's lease.
	RatioLeased = "leased"
	// RatioStandalone is 10,000 tenants, a huge limit, on a node without
	// Redis (in-process counters).
	RatioStandalone = "standalone"
)

// RatioModes are the modes Ratio runs.
var RatioModes = []string{RatioExact, RatioLeased, RatioStandalone}

// RatioConfig is one comparison of a node with allot-load's no-op
// server: the same closed-loop generator alternated between the two,
// Pairs times (no-op, node, no-op, node, ...), every process started
// once. Alternating in one run puts both under the same machine load,
// so their ratio holds on a shared, noisy machine where either rate
// alone does not.
type RatioConfig struct {
	// NodeBin is the allot-node binary (required); LoadBin the
	// allot-load binary whose --noop-listen is the no-op server
	// (required).
	NodeBin, LoadBin string
	// NodeArgs are extra node flags.
	NodeArgs []string
	// Mode is RatioExact, RatioLeased or RatioStandalone.
	Mode string
	// Pairs is how many no-op / node pairs to run. Default 3.
	Pairs int
	// Concurrency is the generator's closed-loop workers. Default 32.
	Concurrency int
	// Measure is the length of each run; Warmup is one run against the
	// node before the first pair, not counted. Defaults 8s and 2s.
	Measure, Warmup time.Duration
	// Timeout bounds each check. Default 2s.
	Timeout time.Duration
	// Conns is the generator's gRPC connections. Default 1.
	Conns int
	// Dir keeps the policy file and the process logs; empty uses a
	// temporary directory removed at the end.
	Dir string
	// SharedRedis runs redis-server on the CPUs the node, the no-op
	// server and the generator use; by default a mode on Redis gives it
	// a CPU of its own, as the sweep does (package doc).
	SharedRedis bool
	// Logger, when set, is told where redis-server runs.
	Logger *slog.Logger
	// Out, when set, receives a header line (mode, workers, load
	// average), a line per pair as it is measured (WritePair), then the
	// summary (WriteSummary).
	Out io.Writer
}

func (c *RatioConfig) defaults() {
	if c.Pairs == 0 {
		c.Pairs = 3
	}
	if c.Concurrency == 0 {
		c.Concurrency = 32
	}
	if c.Measure == 0 {
		c.Measure = 8 * time.Second
	}
	if c.Warmup == 0 {
		c.Warmup = 2 * time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = 2 * time.Second
	}
	if c.Conns <= 0 {
		c.Conns = 1
	}
}

func (c *RatioConfig) validate() error {
	var errs []error
	if c.NodeBin == "" || c.LoadBin == "" {
		errs = append(errs, errors.New("both the allot-node and the allot-load binary are needed"))
	}
	if _, ok := ratioCase(c.Mode); !ok {
		errs = append(errs, fmt.Errorf("mode %q: want %s, %s or %s", c.Mode, RatioExact, RatioLeased, RatioStandalone))
	}
	if c.Pairs < 1 || c.Pairs > 1000 {
		errs = append(errs, fmt.Errorf("pairs %d: want 1..1000", c.Pairs))
	}
	if c.Concurrency < 1 || c.Concurrency > MaxConcurrency {
		errs = append(errs, fmt.Errorf("concurrency %d: want 1..%d", c.Concurrency, MaxConcurrency))
	}
	if c.Measure < 0 || c.Warmup < 0 {
		errs = append(errs, fmt.Errorf("measure %v, warm-up %v: want positive", c.Measure, c.Warmup))
	}
	return errors.Join(errs...)
}

// ratioCase is the policy and key set of mode.
func ratioCase(mode string) (Case, bool) {
	switch mode {
	case RatioExact, RatioStandalone:
		return Case{Precision: "exact", Keys: Uniform10k, Limit: HugeLimit}, true
	case RatioLeased:
		return Case{Precision: "leased", Keys: HotKey, Limit: HugeLimit}, true
	}
	return Case{}, false
}

// Pair is one no-op run and the node run after it.
type Pair struct {
	// Noop and Node are decisions/s.
	Noop, Node float64
	// CPU per call over the run: the node's and its redis-server's
	// during the node run (RedisCPU zero standalone), the no-op server's
	// during its run. Zero where /proc could not be read.
	NodeCPU, RedisCPU, NoopCPU time.Duration
	// GenNoopCPU and GenNodeCPU are the generator's (this process's) CPU
	// per call in the no-op run and in the node run: what the answers'
	// pattern costs the caller.
	GenNoopCPU, GenNodeCPU time.Duration
	// Read and write system calls per call (/proc/PID/io): the node's
	// and the no-op server's, and the generator's in each run. How many
	// answers one socket read or write carries is most of what a call
	// costs on either side (zero where /proc could not be read).
	NodeSys, NoopSys, GenNoopSys, GenNodeSys float64
	// IdleNoop and IdleNode are the fractions of the machine's CPU time
	// left idle in each run, StealNode the fraction the hypervisor took
	// in the node run: a run with idle CPU was bound by latency, not by
	// CPU. Zero where /proc/stat could not be read.
	IdleNoop, IdleNode, StealNode float64
	// Load is the 1-minute load average after the node run (0 unknown).
	Load float64
}

// Ratio is the node's decisions/s over the no-op server's.
func (p Pair) Ratio() float64 {
	if p.Noop <= 0 {
		return 0
	}
	return p.Node / p.Noop
}

// Summarize is the mean, lowest and highest ratio of pairs.
func Summarize(pairs []Pair) (mean, lo, hi float64) {
	for i, p := range pairs {
		r := p.Ratio()
		mean += r
		if i == 0 || r < lo {
			lo = r
		}
		if i == 0 || r > hi {
			hi = r
		}
	}
	if len(pairs) > 0 {
		mean /= float64(len(pairs))
	}
	return mean, lo, hi
}

// WritePair writes pair i (from 1) as one line.
func WritePair(w io.Writer, i int, p Pair) error {
	_, err := fmt.Fprintf(w, "%d: no-op %.0f/s, node %.0f/s, ratio %.3f; CPU per call: node %.1f µs, redis %.1f µs, no-op %.1f µs, "+
		"generator %.1f µs (no-op run) / %.1f µs (node run); syscalls per call: node %.2f, no-op %.2f, generator %.2f / %.2f; "+
		"machine idle %.0f %% / %.0f %%, steal %.0f %% (load %.2f)\n",
		i, p.Noop, p.Node, p.Ratio(), micros(p.NodeCPU), micros(p.RedisCPU), micros(p.NoopCPU),
		micros(p.GenNoopCPU), micros(p.GenNodeCPU), p.NodeSys, p.NoopSys, p.GenNoopSys, p.GenNodeSys,
		100*p.IdleNoop, 100*p.IdleNode, 100*p.StealNode, p.Load)
	return err
}

// WriteSummary writes the mean and range of the pairs' ratios.
func WriteSummary(w io.Writer, pairs []Pair) error {
	mean, lo, hi := Summarize(pairs)
	_, err := fmt.Fprintf(w, "ratio mean %.3f, range %.3f-%.3f over %d pairs\n", mean, lo, hi, len(pairs))
	return err
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// Ratio runs the comparison and returns its pairs. A run in which any
// answer was not decided by the node (FAILED_OPEN, degraded, failed)
// ends it with an error: the ratio is of decisions, not of fast
// refusals. Every process it started is stopped on return.
func Ratio(ctx context.Context, cfg RatioConfig) (pairs []Pair, err error) {
	cfg.defaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("ratio config: %w", err)
	}
	c, _ := ratioCase(cfg.Mode)
	dir, cleanup, err := workDir(cfg.Dir, "allot-ratio-")
	if err != nil {
		return nil, fmt.Errorf("ratio dir: %w", err)
	}
	defer cleanup()
	redisAddr, redisPid := "", 0
	if cfg.Mode != RatioStandalone {
		var cpus []int
		if !cfg.SharedRedis {
			var undo func()
			cpus, undo = redisproc.PinRedis(cfg.Logger)
			defer undo()
		}
		srv, err := redisproc.Start(ctx, redisproc.Options{Dir: dir, CPUs: cpus})
		if err != nil {
			return nil, err
		}
		defer srv.Kill()
		redisAddr, redisPid = srv.Addr, srv.Pid()
	}
	policies := filepath.Join(dir, "policies.yaml")
	if err := os.WriteFile(policies, []byte(c.policy()), 0o644); err != nil {
		return nil, fmt.Errorf("policy file: %w", err)
	}
	hc := &http.Client{Timeout: 2 * time.Second}
	n, err := startNode(ctx, hc, cfg.NodeBin, policies, redisAddr, cfg.NodeArgs, filepath.Join(dir, "node.log"))
	if err != nil {
		return nil, err
	}
	defer n.stop()
	noop, noopAddr, err := startNoop(ctx, cfg.LoadBin, filepath.Join(dir, "noop.log"))
	if err != nil {
		return nil, err
	}
	defer noop.stop()

	run := func(addr string, d time.Duration) (float64, error) {
		rep, err := measure(ctx, closedLoop(addr, c.Keys, cfg.Concurrency, 0, d, cfg.Timeout, cfg.Conns))
		if err == nil {
			err = ctx.Err()
		}
		if err != nil {
			return 0, err
		}
		m := rep.Measured
		if m.FailedOpen > 0 || m.Degraded() > 0 || m.Failed > 0 {
			return 0, fmt.Errorf("%s: %d of %d answers not decided (failed open %d, degraded %d, failed %d)",
				addr, m.FailedOpen+m.Degraded()+m.Failed, m.Sent, m.FailedOpen, m.Degraded(), m.Failed)
		}
		if m.Span <= 0 || m.Sent == 0 {
			return 0, fmt.Errorf("%s: no answer measured", addr)
		}
		return float64(m.Sent) / m.Span.Seconds(), nil
	}
	if _, err := run(n.grpcAddr, cfg.Warmup); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	if cfg.Out != nil {
		if _, err := fmt.Fprintf(cfg.Out, "mode %s, %d workers, %v per run, load average %.2f\n", cfg.Mode, cfg.Concurrency, cfg.Measure, loadAverage()); err != nil {
			return nil, err
		}
	}
	for i := 1; i <= cfg.Pairs; i++ {
		var p Pair
		self := os.Getpid()
		cpu := cpuMeter{cpu: map[int]time.Duration{}, sys: map[int]int64{}}
		cpu.start(noop.pid(), self)
		m0, _ := machineCPU()
		if p.Noop, err = run(noopAddr, cfg.Measure); err != nil {
			return pairs, fmt.Errorf("no-op run %d: %w", i, err)
		}
		calls := p.Noop * cfg.Measure.Seconds()
		p.NoopCPU, p.GenNoopCPU = cpu.perCall(noop.pid(), calls), cpu.perCall(self, calls)
		p.NoopSys, p.GenNoopSys = cpu.syscallsPerCall(noop.pid(), calls), cpu.syscallsPerCall(self, calls)
		m1, _ := machineCPU()
		p.IdleNoop, _ = m0.share(m1)
		cpu = cpuMeter{cpu: map[int]time.Duration{}, sys: map[int]int64{}}
		cpu.start(n.pid(), redisPid, self)
		if p.Node, err = run(n.grpcAddr, cfg.Measure); err != nil {
			// What the node logged (a stall judgement says what it was
			// judged on) and the hypervisor's share, which neither the
			// node nor the kernel's pressure figures see: the run's
			// directory may be a temporary one, removed on return.
			m2, _ := machineCPU()
			_, steal := m1.share(m2)
			return pairs, fmt.Errorf("node run %d (machine steal %.0f %%): %w; node log:\n%s", i, 100*steal, err, n.logTail())
		}
		calls = p.Node * cfg.Measure.Seconds()
		p.NodeCPU, p.RedisCPU, p.GenNodeCPU = cpu.perCall(n.pid(), calls), cpu.perCall(redisPid, calls), cpu.perCall(self, calls)
		p.NodeSys, p.GenNodeSys = cpu.syscallsPerCall(n.pid(), calls), cpu.syscallsPerCall(self, calls)
		m2, _ := machineCPU()
		p.IdleNode, p.StealNode = m1.share(m2)
		p.Load = loadAverage()
		if n.exited() {
			return pairs, fmt.Errorf("the node exited:\n%s", n.logTail())
		}
		pairs = append(pairs, p)
		if cfg.Out != nil {
			if err := WritePair(cfg.Out, i, p); err != nil {
				return pairs, err
			}
		}
	}
	if cfg.Out != nil {
		if err := WriteSummary(cfg.Out, pairs); err != nil {
			return pairs, err
		}
	}
	return pairs, nil
}

// cpuMeter is the CPU time and the read and write system calls of some
// processes at the start of a run. Processes it cannot read (pid 0, no
// /proc) count as zero.
type cpuMeter struct {
	cpu map[int]time.Duration
	sys map[int]int64
}

func (m cpuMeter) start(pids ...int) {
	for _, pid := range pids {
		if pid <= 0 {
			continue
		}
		if d, err := processCPU(pid); err == nil {
			m.cpu[pid] = d
		}
		if n, err := processSyscalls(pid); err == nil {
			m.sys[pid] = n
		}
	}
}

// perCall is pid's CPU since start divided by calls.
func (m cpuMeter) perCall(pid int, calls float64) time.Duration {
	t0, ok := m.cpu[pid]
	if !ok || calls <= 0 {
		return 0
	}
	t1, err := processCPU(pid)
	if err != nil || t1 < t0 {
		return 0
	}
	return time.Duration(float64(t1-t0) / calls)
}

// syscallsPerCall is pid's read and write system calls since start
// divided by calls.
func (m cpuMeter) syscallsPerCall(pid int, calls float64) float64 {
	n0, ok := m.sys[pid]
	if !ok || calls <= 0 {
		return 0
	}
	n1, err := processSyscalls(pid)
	if err != nil || n1 < n0 {
		return 0
	}
	return float64(n1-n0) / calls
}
