// Package sweep runs the load sweep of docs/performance.md ("Overload
// sweep"): it starts a real redis-server on a free loopback port, an
// allot-node from a given binary as a separate process on it, and drives
// it in process with loadgen in closed loops of increasing concurrency,
// for each configuration asked for (precision exact or leased, 10,000
// uniform tenants or one hot one, a huge limit or a real one). Each row
// is measured after a warm-up, on a fresh node and an empty Redis, and
// reads the generator's counts and latencies, the node's /metrics
// (breaker openings) and Redis's INFO (script calls, connections). An
// optional baseline runs allot-load's no-op server, also as a process of
// its own, and the exact path at the same concurrency. Optional pause
// rows stop the node (SIGSTOP, SIGCONT after a pause) once a second
// while it carries load on a healthy Redis, as CFS throttling does.
//
// redis-server runs on a CPU of its own, as on a Redis host of its own:
// the last CPU (redisproc.PinRedis); the node processes, the no-op server
// and the generator (this process) share the others. Config.SharedRedis
// turns that off.
//
// Everything the sweep starts listens on 127.0.0.1 and is stopped when
// Run returns, whatever the reason (a cancelled context included); on
// Linux the kernel also kills the children if the sweep dies.
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
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/testenv/promtext"
	"github.com/allot-dev/allot/internal/testenv/redisproc"
	"github.com/allot-dev/allot/internal/tools/loadgen"
)

// KeySet is a named key distribution; keys are tenant ids.
type KeySet struct {
	Name string
	Keys loadgen.Keys
}

// Limit is a named per-tenant token bucket. Real limits are compared
// with the ideal bucket; a huge one admits everything and is not.
type Limit struct {
	Name         string
	Rate, Burst  int64 // tokens per second, burst
	CompareIdeal bool
}

// The standard key sets and limits of the sweep.
var (
	// Uniform10k is 10,000 tenants drawn uniformly.
	Uniform10k = KeySet{Name: "uniform", Keys: loadgen.Keys{Dist: loadgen.Uniform, Count: 10_000}}
	// HotKey is one tenant taking every request.
	HotKey = KeySet{Name: "hot", Keys: loadgen.Keys{Dist: loadgen.Hot}}
	// HugeLimit denies nothing (1e9/s per tenant).
	HugeLimit = Limit{Name: "huge", Rate: 1_000_000_000, Burst: 1_000_000_000}
	// RealLimit is 1,000/s with burst 1,000 per tenant.
	RealLimit = Limit{Name: "real", Rate: 1000, Burst: 1000, CompareIdeal: true}
)

// Precisions are the policy precisions a sweep can run.
var Precisions = []string{"exact", "leased"}

// Case is one configuration: a policy precision, a key set and a limit.
type Case struct {
	Precision string
	Keys      KeySet
	Limit     Limit
}

func (c Case) String() string { return c.Precision + "/" + c.Keys.Name + "/" + c.Limit.Name }

// policy is the policy file of c: one policy keyed per tenant, failing
// open, so a decision the store could not make shows as FAILED_OPEN.
func (c Case) policy() string {
	return fmt.Sprintf(`# written by the load sweep (loadgen/sweep)
policies:
  - id: sweep
    match: {}
    per: [tenant]
    limits:
      - {name: l, algorithm: token_bucket, limit: %d, period: 1s, burst: %d}
    precision: %s
    on_store_failure: open
`, c.Limit.Rate, c.Limit.Burst, c.Precision)
}

// Cases is every combination of the given precisions, key sets and
// limits, precision outermost.
func Cases(precisions []string, keys []KeySet, limits []Limit) []Case {
	var out []Case
	for _, p := range precisions {
		for _, k := range keys {
			for _, l := range limits {
				out = append(out, Case{Precision: p, Keys: k, Limit: l})
			}
		}
	}
	return out
}

// Config is one sweep.
type Config struct {
	// NodeBin is the allot-node binary to run (required).
	NodeBin string
	// NodeArgs are extra node flags (e.g. --redis-timeout 50ms).
	NodeArgs []string
	// LoadBin is the allot-load binary whose --noop-listen serves the
	// baseline; required when Baseline > 0.
	LoadBin string
	// Levels are the closed-loop concurrencies of each case, in order.
	Levels []int
	Cases  []Case
	// Baseline > 0 first runs the no-op server and the exact path
	// (uniform tenants, huge limit) at this concurrency.
	Baseline int
	// Pauses, when set, add after the level rows a row per case and
	// pause at PauseLevel in which the node is stopped (SIGSTOP) for
	// the pause once every PauseEvery of the measured part, then
	// continued (SIGCONT). Defaults 32 and 1s.
	Pauses     []time.Duration
	PauseLevel int
	PauseEvery time.Duration
	// SharedRedis runs redis-server on the CPUs the node and the
	// generator use; by default it has a CPU of its own (package doc).
	SharedRedis bool
	// Warmup is the start of each row left out of its figures; Measure
	// is the measured part. Defaults 1s and 3s.
	Warmup, Measure time.Duration
	// Timeout bounds each check. Default 2s.
	Timeout time.Duration
	// Conns is the generator's gRPC connections. Default 1.
	Conns int
	// Dir keeps the policy files and the process logs; empty uses a
	// temporary directory removed at the end.
	Dir string
	// Rows, when set, receives the table as rows are measured (header
	// first); Logger gets progress.
	Rows   io.Writer
	Logger *slog.Logger
}

func (c *Config) defaults() {
	if c.Warmup == 0 {
		c.Warmup = time.Second
	}
	if c.Measure <= 0 {
		c.Measure = 3 * time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = 2 * time.Second
	}
	if c.Conns <= 0 {
		c.Conns = 1
	}
	if c.PauseLevel == 0 {
		c.PauseLevel = 32
	}
	if c.PauseEvery == 0 {
		c.PauseEvery = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

func (c *Config) validate() error {
	var errs []error
	if c.NodeBin == "" {
		errs = append(errs, errors.New("no node binary given"))
	}
	if c.Baseline > 0 && c.LoadBin == "" {
		errs = append(errs, errors.New("a baseline needs the allot-load binary (its --noop-listen)"))
	}
	if c.Baseline < 0 || c.Baseline > MaxConcurrency {
		errs = append(errs, fmt.Errorf("baseline concurrency %d: want 0..%d", c.Baseline, MaxConcurrency))
	}
	if len(c.Levels) == 0 && c.Baseline == 0 && len(c.Pauses) == 0 {
		errs = append(errs, errors.New("no level, no baseline and no pause: nothing to run"))
	}
	for _, p := range c.Pauses {
		if p <= 0 || p >= c.PauseEvery {
			errs = append(errs, fmt.Errorf("pause %v: want more than 0 and less than the %v between pauses", p, c.PauseEvery))
		}
	}
	if len(c.Pauses) > 0 && (c.PauseLevel < 1 || c.PauseLevel > MaxConcurrency) {
		errs = append(errs, fmt.Errorf("pause level %d: want 1..%d", c.PauseLevel, MaxConcurrency))
	}
	for _, l := range c.Levels {
		if l < 1 || l > MaxConcurrency {
			errs = append(errs, fmt.Errorf("level %d: want 1..%d", l, MaxConcurrency))
		}
	}
	if c.Warmup < 0 {
		errs = append(errs, fmt.Errorf("warm-up %v: want >= 0", c.Warmup))
	}
	for _, cs := range c.Cases {
		if cs.Precision != "exact" && cs.Precision != "leased" {
			errs = append(errs, fmt.Errorf("case %s: precision %q, want exact or leased", cs, cs.Precision))
		}
		if cs.Limit.Rate <= 0 || cs.Limit.Burst <= 0 {
			errs = append(errs, fmt.Errorf("case %s: want a positive rate and burst", cs))
		}
	}
	return errors.Join(errs...)
}

// Duration estimates how long the sweep takes, process starts aside.
func (c Config) Duration() time.Duration {
	c.defaults()
	rows := c.rows()
	if c.Baseline > 0 {
		rows += 2
	}
	return time.Duration(rows) * (c.Warmup + c.Measure)
}

// rows is the number of node rows of the cases: levels and pauses.
func (c Config) rows() int { return (len(c.Levels) + len(c.Pauses)) * len(c.Cases) }

// runner is one sweep in progress.
type runner struct {
	cfg   Config
	dir   string
	redis *redisproc.Server
	rc    *redis.Client // one connection, made before any row: not in the rows' counts
	hc    *http.Client
	nodes int // node processes started, for log names
}

// Run runs the sweep and returns its rows. It stops at the first error
// (a process that would not start, a scrape that failed) or when ctx
// ends, returning the rows measured so far with the error (ctx.Err()
// for a cancellation); every process it started is stopped either way.
func Run(ctx context.Context, cfg Config) (rows []Row, err error) {
	cfg.defaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("sweep config: %w", err)
	}
	r := &runner{cfg: cfg, hc: &http.Client{Timeout: 2 * time.Second}}
	var cleanup func()
	if r.dir, cleanup, err = workDir(cfg.Dir, "allot-sweep-"); err != nil {
		return nil, fmt.Errorf("sweep dir: %w", err)
	}
	defer cleanup()
	var redisCPUs []int
	if !cfg.SharedRedis {
		var undo func()
		redisCPUs, undo = redisproc.PinRedis(cfg.Logger)
		defer undo()
	}
	if r.redis, err = redisproc.Start(ctx, redisproc.Options{Dir: r.dir, CPUs: redisCPUs}); err != nil {
		return nil, err
	}
	defer r.redis.Kill()
	if cpus, err := r.redis.CPUs(); err == nil {
		cfg.Logger.Info("redis-server", "pid", r.redis.Pid(), "cpus", cpus)
	}
	r.rc = redis.NewClient(&redis.Options{Addr: r.redis.Addr, PoolSize: 1, MaxRetries: -1, Protocol: 2})
	defer r.rc.Close()
	if _, err := r.redisStats(ctx); err != nil {
		return nil, err
	}
	// Redis's own latency monitor records its pauses (expire cycles,
	// slow commands, fork) of 1 ms or more, so a stall the node judged
	// can be laid beside what Redis did in that second.
	for _, kv := range [][2]string{{"latency-monitor-threshold", "1"}, {"slowlog-log-slower-than", "1000"}} {
		if err := r.rc.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			return nil, fmt.Errorf("redis CONFIG SET %s: %w", kv[0], err)
		}
	}
	cfg.Logger.Info("sweep starting", "redis", r.redis.Addr, "rows", cfg.rows(), "estimate", cfg.Duration())
	if cfg.Rows != nil {
		if err := WriteHeader(cfg.Rows); err != nil {
			return nil, err
		}
	}
	emit := func(row Row) error {
		rows = append(rows, row)
		if cfg.Rows != nil {
			return WriteRow(cfg.Rows, row)
		}
		return nil
	}
	if cfg.Baseline > 0 {
		noop, err := r.noopRow(ctx, cfg.Baseline)
		if err == nil {
			err = emit(noop)
		}
		if err != nil {
			return rows, err
		}
		exact, err := r.nodeRow(ctx, Case{Precision: "exact", Keys: Uniform10k, Limit: HugeLimit}, cfg.Baseline, 0)
		if err == nil {
			err = emit(exact)
		}
		if err != nil {
			return rows, err
		}
	}
	for _, c := range cfg.Cases {
		for _, level := range cfg.Levels {
			row, err := r.nodeRow(ctx, c, level, 0)
			if err == nil {
				err = emit(row)
			}
			if err != nil {
				return rows, err
			}
		}
	}
	for _, c := range cfg.Cases {
		for _, pause := range cfg.Pauses {
			row, err := r.nodeRow(ctx, c, cfg.PauseLevel, pause)
			if err == nil {
				err = emit(row)
			}
			if err != nil {
				return rows, err
			}
		}
	}
	return rows, nil
}

// BaselineRatio compares the first node row at the no-op row's
// concurrency with the no-op row in rows: its decisions/s over the
// no-op's (all), and the same counting only the decisions the store made
// (byStore: failed-open and degraded answers left out). ok is false
// without both rows.
func BaselineRatio(rows []Row) (all, byStore float64, ok bool) {
	var noop, exact *Row
	for i := range rows {
		switch {
		case rows[i].Server == "no-op" && noop == nil:
			noop = &rows[i]
		case noop != nil && exact == nil && rows[i].Server == "node" && rows[i].Concurrency == noop.Concurrency:
			exact = &rows[i]
		}
	}
	if noop == nil || exact == nil || noop.Decisions <= 0 {
		return 0, 0, false
	}
	return exact.Decisions / noop.Decisions, exact.StoreDecisions() / noop.Decisions, true
}

// load is the generator's configuration for one row.
func (r *runner) load(addr string, keys KeySet, level int) loadgen.Config {
	return closedLoop(addr, keys, level, r.cfg.Warmup, r.cfg.Measure, r.cfg.Timeout, r.cfg.Conns)
}

// closedLoop is the generator's configuration for one closed-loop run of
// the sweep or the ratio: level workers on keys (tenants "t..."), warmup
// sent but not counted, then measure counted.
func closedLoop(addr string, keys KeySet, level int, warmup, measure, timeout time.Duration, conns int) loadgen.Config {
	return loadgen.Config{
		Targets:     []loadgen.Target{{Region: "default", Addr: addr}},
		Concurrency: level,
		Duration:    warmup + measure,
		Warmup:      warmup,
		Timeout:     timeout,
		Keys:        keys.Keys,
		KeyField:    loadgen.Tenant,
		KeyPrefix:   "t",
		Conns:       conns,
		Interval:    warmup + measure, // the series is not used
		// No Logger: loadgen's per-run lines would drown the table's
		// progress; failures are counted in the rows.
	}
}

// workDir is dir, created if missing, or a new temporary directory
// (named prefix...) that cleanup removes; cleanup leaves a given dir.
func workDir(dir, prefix string) (path string, cleanup func(), err error) {
	if dir != "" {
		return dir, func() {}, os.MkdirAll(dir, 0o755)
	}
	if dir, err = os.MkdirTemp("", prefix); err != nil {
		return "", nil, err
	}
	return dir, func() { os.RemoveAll(dir) }, nil
}

// fill copies the generator's measured figures into row.
func fill(row *Row, rep *loadgen.Report) {
	m := rep.Measured
	row.Sent = m.Sent
	if m.Span > 0 {
		row.Decisions = float64(m.Sent-m.Failed) / m.Span.Seconds()
	}
	row.P50, row.P99, row.P999 = m.Latency.P50, m.Latency.P99, m.Latency.P999
	row.FailedOpen, row.Degraded, row.Shed, row.Errors = m.FailedOpen, m.Degraded(), m.Shed, m.Failed-m.Shed
	row.Admitted = m.Admitted()
	row.Ideal = -1
	if rep.Ideal != nil {
		row.Ideal = m.IdealAdmitted
	}
}

// noopRow measures the no-op server at level, uniform tenants.
func (r *runner) noopRow(ctx context.Context, level int) (Row, error) {
	p, addr, err := startNoop(ctx, r.cfg.LoadBin, filepath.Join(r.dir, "noop.log"))
	if err != nil {
		return Row{}, err
	}
	defer p.stop()
	rep, err := measure(ctx, r.load(addr, Uniform10k, level))
	if err != nil {
		return Row{}, err
	}
	if ctx.Err() != nil {
		return Row{}, ctx.Err()
	}
	row := Row{Server: "no-op", Case: Case{Keys: Uniform10k}, Concurrency: level, Addr: addr, BreakerOpenings: -1}
	fill(&row, rep)
	return row, nil
}

// nodeRow measures case c at level on a fresh node and an empty Redis;
// with pause > 0 the node is stopped for pause once every PauseEvery of
// the measured part.
func (r *runner) nodeRow(ctx context.Context, c Case, level int, pause time.Duration) (Row, error) {
	if err := r.rc.FlushAll(ctx).Err(); err != nil {
		return Row{}, fmt.Errorf("FLUSHALL: %w", err)
	}
	if err := r.rc.Do(ctx, "LATENCY", "RESET").Err(); err != nil {
		return Row{}, fmt.Errorf("LATENCY RESET: %w", err)
	}
	if err := r.rc.SlowLogReset(ctx).Err(); err != nil {
		return Row{}, fmt.Errorf("SLOWLOG RESET: %w", err)
	}
	policies := filepath.Join(r.dir, "policies-"+strings.ReplaceAll(c.String(), "/", "-")+".yaml")
	if err := os.WriteFile(policies, []byte(c.policy()), 0o644); err != nil {
		return Row{}, fmt.Errorf("policy file: %w", err)
	}
	r.nodes++
	n, err := startNode(ctx, r.hc, r.cfg.NodeBin, policies, r.redis.Addr, r.cfg.NodeArgs,
		filepath.Join(r.dir, fmt.Sprintf("node-%d.log", r.nodes)))
	if err != nil {
		return Row{}, err
	}
	defer n.stop()
	r.cfg.Logger.Info("row", "case", c.String(), "concurrency", level, "pause", pause, "node", n.grpcAddr)

	cfg := r.load(n.grpcAddr, c.Keys, level)
	if c.Limit.CompareIdeal {
		cfg.Ideal = &algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: c.Limit.Rate, Period: time.Second, Burst: c.Limit.Burst}
	}
	// Connected and answered before the watch's warm-up and the pauses
	// start, so that they keep time with the generator's (measure).
	client, err := dialReady(ctx, n.grpcAddr, cfg.Conns, cfg.Timeout)
	if err != nil {
		return Row{}, err
	}
	w := &watch{r: r, n: n}
	wctx, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { w.run(wctx, r.cfg.Warmup) })
	var ps pauses
	if pause > 0 {
		wg.Go(func() { ps = pauseEvery(wctx, n.proc, r.cfg.Warmup, r.cfg.PauseEvery, pause) })
	}
	rep, err := runOn(ctx, cfg, client)
	stopWatch()
	wg.Wait()
	if err != nil {
		return Row{}, err
	}
	if ctx.Err() != nil {
		return Row{}, ctx.Err()
	}
	if w.err != nil {
		return Row{}, w.err
	}
	if ps.err != nil {
		return Row{}, ps.err
	}
	row := Row{Server: "node", Case: c, Concurrency: level, Addr: n.grpcAddr, HasRedis: true, Pause: pause, PauseEvery: r.cfg.PauseEvery}
	fill(&row, rep)
	if pause > 0 {
		r.cfg.Logger.Info("node paused", "case", c.String(), "pause", pause, "pauses", ps.n, "longest_stopped", ps.longest.Round(time.Millisecond))
		if ps.n == 0 {
			return Row{}, fmt.Errorf("%s: the node was never paused (measure %v, a pause every %v)", c, r.cfg.Measure, r.cfg.PauseEvery)
		}
	}
	// The end snapshot: the load is over, its last calls answered.
	if err := w.sample(ctx); err != nil {
		return Row{}, err
	}
	if !w.started {
		return Row{}, errors.New("the warm-up snapshot was not taken before the load ended")
	}
	row.Redis = w.redisEnd.Sub(w.redisStart)
	row.BreakerOpenings = w.openings()
	if row.RedisPauses, err = r.redisPauses(ctx); err != nil {
		return Row{}, err
	}
	if len(row.RedisPauses) > 0 {
		slow, err := r.rc.SlowLogGet(ctx, 16).Result()
		if err != nil {
			return Row{}, fmt.Errorf("SLOWLOG GET: %w", err)
		}
		var cmds []string
		for _, l := range slow {
			cmds = append(cmds, fmt.Sprintf("%s %v %.60q", l.Time.UTC().Format("15:04:05.000"), l.Duration, strings.Join(l.Args, " ")))
		}
		r.cfg.Logger.Info("redis latency events", "case", c.String(), "concurrency", level, "events", row.RedisPauses, "slowlog", cmds)
	}
	if n.exited() {
		return Row{}, fmt.Errorf("the node exited during the row:\n%s", n.logTail())
	}
	return row, nil
}

// watchEvery is how often the node's breaker gauge is scraped when the
// node has no openings counter. A breaker stays open for its
// --breaker-max-open (5 s by default), far longer.
const watchEvery = 100 * time.Millisecond

// watch takes the warm-up snapshot of Redis and the node's metrics, and
// follows the breaker gauge until the row ends. Its fields are written
// by run and read after it returned.
type watch struct {
	r *runner
	n *node

	started              bool
	err                  error
	redisStart, redisEnd RedisStats
	counter              bool // the node exports allot_breaker_openings_total
	countStart, countEnd float64
	gauge                bool // the node exports allot_breaker_state
	breakers             breakerWatch
}

// run waits out the warm-up, snapshots, then scrapes the gauge every
// watchEvery until ctx ends (only if the node has no counter).
func (w *watch) run(ctx context.Context, warmup time.Duration) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(warmup):
	}
	if w.err = w.sample(ctx); w.err != nil {
		return
	}
	w.started = true
	if w.counter {
		return
	}
	tick := time.NewTicker(watchEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := w.scrape(ctx); err != nil && ctx.Err() == nil {
			w.err = err
			return
		}
	}
}

// sample reads Redis INFO and the node's metrics: the first call is the
// start of the measured part, the next the end.
func (w *watch) sample(ctx context.Context) error {
	st, err := w.r.redisStats(ctx)
	if err != nil {
		return err
	}
	if w.started {
		w.redisEnd = st
	} else {
		w.redisStart = st
	}
	return w.scrape(ctx)
}

func (w *watch) scrape(ctx context.Context) error {
	fams, err := w.r.metrics(ctx, w.n)
	if err != nil {
		return err
	}
	if v, ok := Sum(fams, "allot_breaker_openings_total"); ok {
		if !w.started {
			w.counter, w.countStart = true, v
		}
		w.countEnd = v
	}
	if _, ok := Sum(fams, "allot_breaker_state"); ok {
		w.gauge = true
	}
	w.breakers.observe(ByLabels(fams, "allot_breaker_state"))
	return nil
}

// openings is the breaker openings of the measured part, or -1 when the
// node exports nothing to count them by.
func (w *watch) openings() int {
	switch {
	case w.counter:
		return int(w.countEnd - w.countStart)
	case w.gauge:
		return w.breakers.openings
	}
	return -1
}

// redisStats reads INFO commandstats and stats.
func (r *runner) redisStats(ctx context.Context) (RedisStats, error) {
	text, err := r.rc.Info(ctx, "commandstats", "stats").Result()
	if err != nil {
		return RedisStats{}, fmt.Errorf("redis INFO: %w", err)
	}
	return ParseRedisStats(text)
}

// redisPauses reads LATENCY LATEST: each event Redis's latency monitor
// saw since the row's LATENCY RESET, as "event max=Nms at=unix". When
// there are any, the row's log line also gives the commands of 1 ms or
// more from SLOWLOG.
func (r *runner) redisPauses(ctx context.Context) ([]string, error) {
	v, err := r.rc.Do(ctx, "LATENCY", "LATEST").Slice()
	if err != nil {
		return nil, fmt.Errorf("LATENCY LATEST: %w", err)
	}
	var out []string
	for _, e := range v {
		f, ok := e.([]any)
		if !ok || len(f) < 4 {
			return nil, fmt.Errorf("LATENCY LATEST: unexpected entry %v", e)
		}
		out = append(out, fmt.Sprintf("%v max=%vms latest=%vms at=%v", f[0], f[3], f[2], f[1]))
	}
	return out, nil
}

// metrics scrapes the node's /metrics.
func (r *runner) metrics(ctx context.Context, n *node) (map[string]*dto.MetricFamily, error) {
	return promtext.Get(ctx, r.hc, "http://"+n.httpAddr+"/metrics")
}
