package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/allot-dev/allot/internal/envflag"
	"github.com/allot-dev/allot/internal/loadgen/sweep"
)

// runRatio is `allot-load ratio`: a node's single-check rate against the
// no-op server's with the same generator, alternated in one run
// (package loadgen/sweep, Ratio), one line per pair and the mean.
func runRatio(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("allot-load ratio", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mode := fs.String("mode", sweep.RatioExact, "what the node decides: "+strings.Join(sweep.RatioModes, ", ")+
		" (exact: 10,000 tenants on Redis; leased: one hot tenant, precision leased, on Redis; standalone: 10,000 tenants, no Redis)")
	nodeBin := fs.String("node-bin", "bin/allot-node", "allot-node binary to start (a separate process)")
	nodeArgs := fs.String("node-args", "", "extra allot-node flags, space-separated (e.g. \"--redis-pipelines 1\")")
	pairs := fs.Int("pairs", 3, "no-op / node pairs to run, alternated")
	conc := fs.Int("concurrency", 32, "closed-loop workers of the generator")
	measure := fs.Duration("measure", 8*time.Second, "length of each run")
	warmup := fs.Duration("warmup", 2*time.Second, "one uncounted run against the node before the first pair")
	conns := fs.Int("conns", 1, "generator gRPC connections")
	dir := fs.String("dir", "", "keep the policy file and the redis-server, node and no-op logs here (default: a temporary directory, removed)")
	envflag.Usage(fs, "ALLOT_LOAD_RATIO_")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("ratio: unexpected arguments %q", fs.Args())
	}
	if err := envflag.Apply(fs, "ALLOT_LOAD_RATIO_"); err != nil {
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
	if _, err := os.Stat(*nodeBin); err != nil {
		return fmt.Errorf("--node-bin: %w (make build writes bin/allot-node)", err)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("the no-op server runs this binary: %w", err)
	}
	cfg := sweep.RatioConfig{
		NodeBin: *nodeBin, LoadBin: self, NodeArgs: strings.Fields(*nodeArgs), Mode: *mode,
		Pairs: *pairs, Concurrency: *conc, Measure: *measure, Warmup: *warmup, Conns: *conns, Dir: *dir,
		Out: stdout,
	}
	_, err = sweep.Ratio(ctx, cfg)
	return err
}
