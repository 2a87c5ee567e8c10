package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/allot-dev/allot/internal/tools/loadgen/sweep"
)

// runRatio is `allot-load ratio`: a node's single-check rate against the
// no-op server's with the same generator, alternated in one run
// (package loadgen/sweep, Ratio), one line per pair and the mean.
func runRatio(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("allot-load ratio", "ALLOT_LOAD_RATIO_", stderr)
	mode := fs.String("mode", sweep.RatioExact, "what the node decides: "+strings.Join(sweep.RatioModes, ", ")+
		" (exact: 10,000 tenants on Redis; leased: one hot tenant, precision leased, on Redis; standalone: 10,000 tenants, no Redis)")
	node := fs.nodeFlags("allot-node binary to start (a separate process)", "--redis-timeout 10ms")
	pairs := fs.Int("pairs", 3, "no-op / node pairs to run, alternated")
	conc := fs.Int("concurrency", 32, "closed-loop workers of the generator")
	measure := fs.Duration("measure", 8*time.Second, "length of each run")
	warmup := fs.Duration("warmup", 2*time.Second, "one uncounted run against the node before the first pair")
	conns := fs.Int("conns", 1, "generator gRPC connections")
	redisCPU := fs.redisCPU()
	dir := fs.String("dir", "", "keep the policy file and the redis-server, node and no-op logs here (default: a temporary directory, removed)")
	if err := fs.parse(args); err != nil {
		return err
	}
	if !slices.Contains(sweep.RatioModes, *mode) {
		return fmt.Errorf("--mode %q: want one of %s", *mode, strings.Join(sweep.RatioModes, ", "))
	}
	if *pairs < 1 || *conc < 1 {
		return fmt.Errorf("--pairs %d, --concurrency %d: want at least 1", *pairs, *conc)
	}
	if *measure <= 0 || *warmup <= 0 {
		return fmt.Errorf("--measure %v, --warmup %v: want positive", *measure, *warmup)
	}
	shared, err := redisCPU.shared()
	if err != nil {
		return err
	}
	if err := node.check(); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("the no-op server runs this binary: %w", err)
	}
	cfg := sweep.RatioConfig{
		NodeBin: *node.bin, LoadBin: self, NodeArgs: node.extra(), Mode: *mode,
		Pairs: *pairs, Concurrency: *conc, Measure: *measure, Warmup: *warmup, Conns: *conns, Dir: *dir,
		SharedRedis: shared, Logger: slog.New(slog.NewTextHandler(stderr, nil)), Out: stdout,
	}
	_, err = sweep.Ratio(ctx, cfg)
	return err
}
