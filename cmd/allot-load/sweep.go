package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/allot-dev/allot/cmd/internal/cli"
	"github.com/allot-dev/allot/internal/tools/loadgen/sweep"
)

// runSweep is `allot-load sweep`: the load sweep of docs/performance.md
// ("Overload sweep"; package loadgen/sweep) against a node binary on a redis-server it
// starts.
func runSweep(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("allot-load sweep", "ALLOT_LOAD_SWEEP_", stderr)
	node := fs.nodeFlags("allot-node binary to start (a separate process) on the sweep's redis-server", "--redis-timeout 50ms")
	levels := fs.String("levels", "1,4,16,64,256", "closed-loop concurrencies, comma-separated")
	precisions := fs.String("precision", "exact,leased", "policy precisions to run: exact, leased")
	keys := fs.String("keys", "uniform,hot", "key sets to run: uniform (--key-count tenants) and hot (one tenant)")
	keyCount := fs.Int("key-count", 10_000, "tenants of the uniform key set")
	limits := fs.String("limits", "huge,real", "limits to run: huge (1e9/s, nothing denied) and real (1000/s burst 1000 per tenant, compared with the ideal bucket)")
	warmup := fs.Duration("warmup", time.Second, "start of each row that is sent but not counted")
	measure := fs.Duration("measure", 3*time.Second, "measured part of each row")
	baseline := fs.Int("baseline", 32, "first run allot-load's no-op server (its own process) and the exact path at this concurrency; 0 skips")
	timeout := fs.Duration("timeout", 2*time.Second, "per-check timeout; a timed-out check counts as an error")
	conns := fs.Int("conns", 1, "generator gRPC connections")
	pauses := fs.String("pauses", "", "after the level rows, a row per case and pause (e.g. 20ms,100ms,250ms) in which the node is "+
		"stopped (SIGSTOP) for the pause once every --pause-every, then continued (SIGCONT), as CFS throttling does; empty: none")
	pauseLevel := fs.Int("pause-level", 32, "closed-loop concurrency of the pause rows")
	pauseEvery := fs.Duration("pause-every", time.Second, "time from one pause of the node to the next in a pause row")
	redisCPU := fs.redisCPU()
	dir := fs.String("dir", "", "keep the policy files and the redis-server, node and no-op logs here (default: a temporary directory, removed)")
	logLevel := fs.String("log-level", "info", "log level of the sweep's progress on stderr: debug, info, warn, error")
	if err := fs.parse(args); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	cfg := sweep.Config{
		NodeBin: *node.bin, NodeArgs: node.extra(), Baseline: *baseline,
		PauseLevel: *pauseLevel, PauseEvery: *pauseEvery,
		Warmup: *warmup, Measure: *measure, Timeout: *timeout, Conns: *conns, Dir: *dir,
		Rows: stdout, Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})),
	}
	var err error
	if *levels != "" {
		if cfg.Levels, err = sweep.ParseLevels(*levels); err != nil {
			return fmt.Errorf("--levels: %w", err)
		}
	}
	for _, p := range cli.List(*pauses) {
		d, err := time.ParseDuration(p)
		if err != nil || d <= 0 || d >= *pauseEvery {
			return fmt.Errorf("--pauses %q: want durations above 0 and below --pause-every (%v)", p, *pauseEvery)
		}
		cfg.Pauses = append(cfg.Pauses, d)
	}
	if *pauseLevel < 1 || *pauseEvery <= 0 {
		return fmt.Errorf("--pause-level %d, --pause-every %v: want positive", *pauseLevel, *pauseEvery)
	}
	if cfg.SharedRedis, err = redisCPU.shared(); err != nil {
		return err
	}
	if cfg.Cases, err = parseCases(*precisions, *keys, *keyCount, *limits); err != nil {
		return err
	}
	if *warmup <= 0 || *measure <= 0 {
		return errors.New("--warmup and --measure must be positive: every row is bounded and warmed")
	}
	if *keyCount < 1 {
		return fmt.Errorf("--key-count %d: want >= 1", *keyCount)
	}
	if cfg.Baseline > 0 {
		if cfg.LoadBin, err = os.Executable(); err != nil {
			return fmt.Errorf("the no-op baseline runs this binary: %w", err)
		}
	}
	if err := node.check(); err != nil {
		return err
	}
	cfg.Logger.Info("sweep", "rows", (len(cfg.Levels)+len(cfg.Pauses))*len(cfg.Cases), "baseline", cfg.Baseline, "estimated", cfg.Duration().String())
	rows, err := sweep.Run(ctx, cfg)
	if all, byStore, ok := sweep.BaselineRatio(rows); ok {
		fmt.Fprintf(stdout, "\nexact / no-op decisions/s at concurrency %d: %.2f (counting only decisions the store made: %.2f)\n",
			cfg.Baseline, all, byStore)
	}
	return err
}

// parseCases turns the --precision, --keys and --limits lists into the
// sweep's cases.
func parseCases(precisions, keys string, keyCount int, limits string) ([]sweep.Case, error) {
	var ps []string
	for _, p := range cli.List(precisions) {
		if p != "exact" && p != "leased" {
			return nil, fmt.Errorf("--precision %q: want exact or leased", p)
		}
		ps = append(ps, p)
	}
	var ks []sweep.KeySet
	for _, k := range cli.List(keys) {
		switch k {
		case "uniform":
			u := sweep.Uniform10k
			u.Keys.Count = keyCount
			ks = append(ks, u)
		case "hot":
			ks = append(ks, sweep.HotKey)
		default:
			return nil, fmt.Errorf("--keys %q: want uniform or hot", k)
		}
	}
	var ls []sweep.Limit
	for _, l := range cli.List(limits) {
		switch l {
		case "huge":
			ls = append(ls, sweep.HugeLimit)
		case "real":
			ls = append(ls, sweep.RealLimit)
		default:
			return nil, fmt.Errorf("--limits %q: want huge or real", l)
		}
	}
	return sweep.Cases(ps, ks, ls), nil
}
