// Command allot-load drives load at Allot nodes and reports what they
// decided. It wraps package loadgen.
//
//	# 5,000 checks/s for 30 s over gRPC, Zipf keys, one node
//	allot-load --target 127.0.0.1:8081 --rate 5000 --duration 30s --keys zipf --key-count 10000 --zipf-s 1.1
//
//	# three regions, traffic moving to us after 30 s, against the ideal 100/s burst 200 per key
//	allot-load --target us=127.0.0.1:8081,eu=127.0.0.1:9081,ap=127.0.0.1:10081 \
//	    --split us=0.33,eu=0.33,ap=0.34 --shift-at 30s --shift-split us=0.9,eu=0.05,ap=0.05 \
//	    --rate 3000 --duration 60s --keys hot --ideal-rate 100/s --ideal-burst 200 \
//	    --csv load.csv --png load.png
//
//	# one region's traffic spread over its two nodes, request by request
//	allot-load --target us=127.0.0.1:8081,us=127.0.0.1:8082,eu=127.0.0.1:9081 --rate 3000 --duration 30s
//
//	# closed loop: 32 workers as fast as answers come
//	allot-load --target 127.0.0.1:8081 --concurrency 32 --duration 10s
//
//	# a no-op RateLimiterService to compare against (answers ALLOWED; Ctrl-C stops it)
//	allot-load --noop-listen 127.0.0.1:7081
//
//	# the load sweep (docs/performance.md, "Overload sweep"): a redis-server and
//	# a node process it starts, closed loops of 1 to 256 workers, one table row each
//	allot-load sweep --node-bin bin/allot-node
//
//	# a node against the no-op server, same generator, alternated in one run
//	# (docs/performance.md, "Single check"): exact (on Redis), leased or standalone
//	allot-load ratio --mode exact --pairs 3 --node-bin bin/allot-node
//
// The run stops after --duration or --max-requests, or on Ctrl-C, and
// prints its report either way. Every flag can also be set as an
// environment variable: --key-count is ALLOT_LOAD_KEY_COUNT, and a flag
// of the sweep or ratio subcommand takes the prefix ALLOT_LOAD_SWEEP_ or
// ALLOT_LOAD_RATIO_ instead. The command line wins.
//
// To a node it did not start it only sends checks and reads the answers:
// it writes no policy or setting there. (The sweep and ratio write the
// policy files of the nodes they start, and the sweep reads their
// /metrics.)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/allot-dev/allot/internal/tools/loadgen"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "allot-load:", err)
		os.Exit(1)
	}
}

// options are the parsed flags.
type options struct {
	noopListen   string
	cfg          loadgen.Config
	csvPath      string
	pngPath      string
	quiet        bool
	logLevel     slog.Level
	idealRate    string
	idealBurst   int64
	targets      string
	split, shift string
	protocol     string
	dist         string
	keyField     string
}

func parse(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	c := &o.cfg
	c.Template = &ratelimitv1.RateLimitRequest{}
	fs := newFlags("allot-load", "ALLOT_LOAD_", stderr)
	fs.StringVar(&o.targets, "target", "127.0.0.1:8081", "targets as region=addr,... (gRPC host:port, or HTTP host:port or base URL); a bare address is region \"default\"; "+
		"a region named again gets another node, and its traffic is spread evenly over its nodes (us=host:8081,us=host:8082,eu=host:9081)")
	fs.StringVar(&o.protocol, "protocol", "grpc", "grpc (CheckRateLimit) or http (POST /v1/check, JSON)")
	fs.Float64Var(&c.Rate, "rate", 0, "open loop: requests per second over all targets; 0 runs closed loop")
	fs.IntVar(&c.Concurrency, "concurrency", 64, "workers: most requests in flight (open loop) or the load itself (closed loop)")
	fs.DurationVar(&c.Duration, "duration", 10*time.Second, "how long the run lasts (required > 0)")
	fs.Int64Var(&c.MaxRequests, "max-requests", 0, "stop after this many requests (0: no count limit)")
	fs.DurationVar(&c.Timeout, "timeout", 2*time.Second, "per-request timeout; a timed-out request counts as failed")
	fs.StringVar(&o.dist, "keys", "uniform", "key distribution: uniform, zipf or hot (one key)")
	fs.IntVar(&c.Keys.Count, "key-count", 1000, "K, the number of keys (uniform, zipf)")
	fs.Float64Var(&c.Keys.S, "zipf-s", 1.1, "Zipf exponent s >= 0: key k is drawn with probability proportional to 1/(k+1)^s")
	fs.StringVar(&o.keyField, "key-field", "client", "request field that carries the key: client, tenant or ip (10.x.y.z)")
	fs.StringVar(&c.KeyPrefix, "key-prefix", "k", "prefix of client or tenant keys (k0, k1, ...)")
	fs.StringVar(&c.Template.TenantId, "tenant", "", "tenant_id of every request (unless --key-field tenant)")
	fs.StringVar(&c.Template.ClientIdentifier, "client", "", "client_identifier of every request (unless --key-field client)")
	fs.StringVar(&c.Template.Route, "route", "", "route of every request")
	fs.StringVar(&c.Template.Method, "method", "", "method of every request")
	fs.StringVar(&c.Template.Tier, "tier", "", "tier of every request")
	fs.StringVar(&c.Template.Ip, "ip", "", "ip of every request (unless --key-field ip)")
	cost := fs.Int("cost", 0, "token_cost of every request (0: the route's cost from the policy, else 1; the ideal assumes 1)")
	fs.StringVar(&o.split, "split", "", "traffic share per region, e.g. us=0.33,eu=0.33,ap=0.34 (default: even)")
	fs.DurationVar(&c.ShiftAt, "shift-at", 0, "when (since the start) the split changes to --shift-split")
	fs.StringVar(&o.shift, "shift-split", "", "the split from --shift-at on")
	seed := fs.Uint64("seed", 1, "seed for the choice of region and key (same seed, same requests)")
	fs.DurationVar(&c.Interval, "interval", 0, "width of one time-series point (0: 1s, or duration/300 past 5 minutes)")
	fs.StringVar(&o.idealRate, "ideal-rate", "", "the limit each key should get: tokens per second (\"100\") or per period (\"60/1h\", \"5/s\")")
	fs.Int64Var(&o.idealBurst, "ideal-burst", 0, "the ideal limit's burst (0: its limit)")
	fs.IntVar(&c.Conns, "conns", 1, "gRPC connections per target")
	fs.StringVar(&o.csvPath, "csv", "", "write the time series as CSV to this file")
	fs.StringVar(&o.pngPath, "png", "", "plot admitted vs ideal over time as PNG to this file")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress line")
	fs.StringVar(&o.noopListen, "noop-listen", "", "instead of sending load, serve a no-op RateLimiterService (always ALLOWED) on this address until Ctrl-C")
	logLevel := fs.String("log-level", "warn", "log level: debug, info, warn, error")
	if err := fs.parse(args); err != nil {
		return nil, err
	}
	c.Seed = *seed
	if *cost < 0 {
		return nil, fmt.Errorf("--cost %d: want >= 0", *cost)
	}
	c.Template.TokenCost = int32(min(*cost, 1<<30))
	if err := o.logLevel.UnmarshalText([]byte(*logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return o, o.resolve()
}

// resolve turns the string flags into the Config's types.
func (o *options) resolve() error {
	c := &o.cfg
	var err error
	if o.noopListen != "" {
		return nil
	}
	if c.Targets, err = loadgen.ParseTargets(o.targets); err != nil {
		return fmt.Errorf("--target: %w", err)
	}
	if c.Protocol, err = loadgen.ParseProtocol(o.protocol); err != nil {
		return fmt.Errorf("--protocol: %w", err)
	}
	if c.Keys.Dist, err = loadgen.ParseDist(o.dist); err != nil {
		return fmt.Errorf("--keys: %w", err)
	}
	if c.KeyField, err = loadgen.ParseKeyField(o.keyField); err != nil {
		return fmt.Errorf("--key-field: %w", err)
	}
	if c.Split, err = loadgen.ParseSplit(o.split); err != nil {
		return fmt.Errorf("--split: %w", err)
	}
	if c.ShiftSplit, err = loadgen.ParseSplit(o.shift); err != nil {
		return fmt.Errorf("--shift-split: %w", err)
	}
	if (c.ShiftAt > 0) != (len(c.ShiftSplit) > 0) {
		return errors.New("--shift-at and --shift-split go together")
	}
	if c.Ideal, err = loadgen.ParseIdeal(o.idealRate, o.idealBurst); err != nil {
		return fmt.Errorf("--ideal-rate: %w", err)
	}
	if o.idealBurst != 0 && c.Ideal == nil {
		return errors.New("--ideal-burst needs --ideal-rate")
	}
	return nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "sweep" {
		return runSweep(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "ratio" {
		return runRatio(ctx, args[1:], stdout, stderr)
	}
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: o.logLevel}))
	if o.noopListen != "" {
		return serveNoop(ctx, o.noopListen, stdout)
	}
	o.cfg.Logger = log
	if !o.quiet {
		o.cfg.Progress = stderr
	}
	rep, err := loadgen.Run(ctx, o.cfg)
	if err != nil {
		return err
	}
	return errors.Join(rep.WriteText(stdout), writeFile(o.csvPath, rep.WriteCSV), writeFile(o.pngPath, rep.WritePNG))
}

// serveNoop serves the no-op service until ctx is done.
func serveNoop(ctx context.Context, addr string, stdout io.Writer) error {
	s, err := loadgen.StartNoop(addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "no-op RateLimiterService (always ALLOWED) on %s; Ctrl-C stops it\n", s.Addr())
	select {
	case <-ctx.Done():
	case <-s.Done():
	}
	return s.Close()
}

// writeFile writes path with write, unless path is empty.
func writeFile(path string, write func(io.Writer) error) (err error) {
	if path == "" {
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	defer func() {
		if cerr := f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close %s: %w", path, cerr)
		}
	}()
	if err := write(f); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
