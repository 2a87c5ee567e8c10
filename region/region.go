// Package region is the client of one region's Redis (a single server or a
// Redis Cluster), which holds the authoritative bucket state for the
// region.
//
// It owns: connecting (and detecting cluster mode), turning algorithm
// Groups (Take, Refund: the decider's decide.Store) and lease Groups
// (Lease, Return: the lease manager's lease.Source) into calls of the
// scripts in package lua, pipelining those calls into one round trip
// (call.go, pipeline.go), a breaker per shard (breaker.go, stall.go,
// health.go), recovering from a flushed script cache and a failover
// (script.go, failover.go), settling RLQS parts (part.go), and turning
// replies back into algorithm Results and lease Replies.
//
// It must not: decide policy (which keys, limits or costs apply), keep
// bucket state or clocks of its own (Redis TIME is the only clock), retry
// a script whose reply was lost (it may have run, and a second take would
// count twice), or decide what happens when Redis fails (fail open or
// closed is the caller's call; every failure is returned as an error).
package region

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/lua"
)

// Defaults for Options fields left zero.
const (
	DefaultDialTimeout  = 2 * time.Second
	DefaultReadTimeout  = time.Second
	DefaultWriteTimeout = time.Second
	// DefaultTimeout is a node's default budget for one decision that
	// asks Redis (flag --redis-timeout): a slow Redis is worse than a dead
	// one (seed 001). The Redis call itself gets the budget less a margin
	// (CallTimeout): 4 ms by default. Options.Timeout left zero means
	// ReadTimeout instead, for tools (coordinator, tests) that are not on
	// a request path.
	DefaultTimeout = 5 * time.Millisecond
	// DefaultTimeoutMargin is the most of a decision's budget that
	// CallTimeout keeps back from the Redis call by default (flag
	// --redis-timeout-margin 0): the budget/5 cap leaves at least 80 % of
	// a tight budget to Redis. 1 ms is the Go runtime's timer granularity
	// on an idle process (it sleeps in epoll_wait, whose timeout is whole
	// milliseconds), i.e. how late a deadline's wake-up can be before any
	// scheduling delay; see CallTimeout.
	DefaultTimeoutMargin = time.Millisecond
	// DefaultMaxWait bounds how long a call may wait for this node to get
	// it answered by a healthy shard (queued, sent, replies unread) before
	// it is shed (ErrOverloaded).
	DefaultMaxWait = time.Second
	// DefaultPipelines is how many pipelines may be in flight to one shard
	// at once; calls beyond wait and go out together in the next one. One:
	// a second pipeline in flight halves the calls each round trip
	// carries, and on a busy node every round trip costs both processes
	// system calls and Redis a script entry, so from 16 checks in flight
	// up one pipeline answered as many checks per second or more, with a
	// third fewer round trips (docs/performance.md, "Pipelines per
	// shard"; below that a second is seldom in flight). A second hides a
	// network round trip under load; an operator with a distant Redis may
	// set 2.
	DefaultPipelines = 1
	// DefaultMaxBatch is the most calls one pipeline carries.
	DefaultMaxBatch = 128
	// DefaultMaxQueue is the most calls that may wait for one shard; more
	// are shed at once.
	DefaultMaxQueue = 16384
)

// Options configure the connection to the region's Redis.
type Options struct {
	// Username and Password authenticate (ACL user, or just a password).
	Username string
	Password string
	// TLSConfig, when set, connects over TLS (with a Dialer, the Dialer
	// must do the TLS itself). For a cluster it applies to every shard.
	TLSConfig *tls.Config
	// DialTimeout, ReadTimeout and WriteTimeout bound each network step;
	// zero means the Default* constant.
	DialTimeout  time.Duration
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
	// PoolSize is the connection pool size per node; zero means the
	// go-redis default (10 per GOMAXPROCS).
	PoolSize int
	// Timeout is the stall threshold T (stall.go): a shard whose oldest
	// pipeline waited T while nothing arrived from it for T, no reply
	// waits unread, and the check ran on time, is stalled; its calls fail
	// with ErrStalled and its breaker opens. Zero means ReadTimeout.
	// Nodes set CallTimeout(--redis-timeout, 0): 4 ms by default. It is
	// not a deadline of each call: a call queued or unread because this
	// node is busy waits on (up to MaxWait).
	Timeout time.Duration
	// MaxWait bounds how long a call may wait on a shard judged healthy
	// (queue wait included) before it is shed with ErrOverloaded (default
	// DefaultMaxWait); it is also the socket deadline of a pipeline.
	MaxWait time.Duration
	// Pipelines, MaxBatch and MaxQueue shape the coalescing of calls per
	// shard: pipelines in flight at once, calls per pipeline, calls
	// queued (more are shed). Zero means the Default* constant.
	Pipelines int
	MaxBatch  int
	MaxQueue  int
	// Breaker configures the per-shard circuit breakers (breaker.go).
	Breaker BreakerOptions
	// Logger receives breaker state changes; nil discards them.
	Logger *slog.Logger
	// NoWarmUp skips Open's warm-up of each shard (Store.warm): for a store
	// that sends none of the decision scripts and has no busy start, as
	// a coordinator's, the warm-up would only hold Pipelines connections
	// and load five scripts it never runs.
	NoWarmUp bool
	// Dialer, when set, opens every connection (addr is the Redis node's
	// own address, as the cluster announces it). A seam for tests that
	// route one shard through a fault-injecting proxy.
	Dialer func(ctx context.Context, network, addr string) (net.Conn, error)
}

// CallTimeout is the deadline of the Redis calls of a decision whose
// whole time budget is budget (a node's --redis-timeout): the budget less
// a margin kept for what follows the deadline. A call that times out is
// not noticed at its deadline but when the runtime wakes its goroutine,
// up to about a millisecond later on an idle process (timers wait in
// epoll_wait, in whole milliseconds) plus the machine's scheduling delay;
// then the decision still has to be made without Redis (by
// on_store_failure, in memory). The margin is for both, so that the
// decision as a whole ends by the budget, not the Redis wait alone.
//
// margin 0 means min(DefaultTimeoutMargin, budget/5); a negative margin
// means none (the call gets the whole budget). A budget that is not
// positive, or a margin that leaves the call no time, is an error.
func CallTimeout(budget, margin time.Duration) (time.Duration, error) {
	if budget <= 0 {
		return 0, fmt.Errorf("region: timeout %v must be positive", budget)
	}
	switch {
	case margin == 0:
		margin = min(DefaultTimeoutMargin, budget/5)
	case margin < 0:
		margin = 0
	case margin >= budget:
		return 0, fmt.Errorf("region: timeout margin %v leaves no time of the %v timeout for the Redis call", margin, budget)
	}
	return budget - margin, nil
}

func (o Options) withDefaults() Options {
	if o.DialTimeout <= 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = DefaultReadTimeout
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.Timeout <= 0 {
		o.Timeout = o.ReadTimeout
	}
	if o.MaxWait <= 0 {
		o.MaxWait = DefaultMaxWait
	}
	if o.Pipelines <= 0 {
		o.Pipelines = DefaultPipelines
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	if o.MaxQueue <= 0 {
		o.MaxQueue = DefaultMaxQueue
	}
	o.Breaker = o.Breaker.withDefaults()
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Store runs the bucket scripts on the region's Redis. It is safe for
// concurrent use. Calls are coalesced per shard (pipeline.go): concurrent
// calls bound for one Redis master share round trips.
type Store struct {
	client  redis.UniversalClient
	cluster bool
	addr    string // the single server's address (its shard's name)
	opts    Options
	conns   *conns

	mu     sync.RWMutex
	shards map[string]*shard

	wg     sync.WaitGroup // pipeline workers and probes
	done   chan struct{}  // closed by Close: workers exit
	closed atomic.Bool
	hashes sync.Map // *redis.Script -> its hash as an EVALSHA argument (any), boxed once
	specs  specArgs
	stats  struct{ pipelines, calls, stalls, shed atomic.Int64 }
}

func newStore(c redis.UniversalClient, cluster bool, addr string, opts Options, cs *conns) *Store {
	return &Store{client: c, cluster: cluster, addr: addr, opts: opts, conns: cs, shards: map[string]*shard{}, done: make(chan struct{})}
}

// Open connects to the region's Redis. One address is probed with
// INFO cluster and served by a cluster client if it is a cluster node;
// several addresses are always cluster seed nodes. Open fails if Redis
// does not answer within ctx or the dial timeout.
func Open(ctx context.Context, addrs []string, opts Options) (*Store, error) {
	if len(addrs) == 0 {
		return nil, errors.New("region: open: no Redis address")
	}
	opts = opts.withDefaults()
	cs := &conns{}
	dial := cs.dialer(opts)
	cluster := len(addrs) > 1
	if !cluster {
		c := redis.NewClient(clientOptions(addrs[0], opts, dial))
		enabled, err := clusterEnabled(ctx, c)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("region: open %s: %w", addrs[0], err)
		}
		if !enabled {
			s := newStore(c, false, addrs[0], opts, cs)
			s.shard(addrs[0], c) // reported by Shards from the start
			s.warm(ctx, c)
			return s, nil
		}
		c.Close()
		cluster = true
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:        addrs,
		Username:     opts.Username,
		Password:     opts.Password,
		TLSConfig:    opts.TLSConfig,
		DialTimeout:  opts.DialTimeout,
		ReadTimeout:  opts.ReadTimeout,
		WriteTimeout: opts.WriteTimeout,
		PoolSize:     opts.PoolSize,
		// Network errors are not retried: a script whose reply was lost may
		// have run. MOVED/ASK redirects are still followed (MaxRedirects),
		// as the script did not run on the wrong node.
		MaxRetries: -1,
		// Deadlines: see clientOptions.
		ContextTimeoutEnabled: true,
		DialerRetries:         1,
		PoolTimeout:           opts.MaxWait,
		Dialer:                dial,
	})
	if err := cc.Ping(ctx).Err(); err != nil {
		cc.Close()
		return nil, fmt.Errorf("region: open cluster %s: %w", strings.Join(addrs, ","), err)
	}
	// Open a connection to every shard now: a first call that must dial
	// and handshake would not fit a deadline of a few milliseconds.
	if err := cc.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() }); err != nil {
		cc.Close()
		return nil, fmt.Errorf("region: open cluster %s: %w", strings.Join(addrs, ","), err)
	}
	s := newStore(cc, true, "", opts, cs)
	_ = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		s.shard(c.Options().Addr, c) // reported by Shards from the start
		s.warm(ctx, c)
		return nil
	})
	return s, nil
}

// storeScripts are the scripts the store's methods send (evalAll).
var storeScripts = []*redis.Script{lua.CheckTB, lua.Check, lua.Refund, lua.Lease, lua.Return, lua.Part}

// warm readies one shard for the first calls of a busy start: it opens
// as many connections as pipelines may be in flight and loads the
// store's scripts. Otherwise the first pipelines dial, handshake and
// compile (NOSCRIPT, then EVAL) inside the time their stall judgement
// counts, before any round trip has taught the threshold what this
// machine's round trips are: 32 checks at once on a node just started
// made those first pipelines take 8-22 ms, judged a stall at 4 ms (3 of
// 76 starts, docs/performance.md "Start warm-up"). Best effort: a shard
// that refuses is logged, and calls fall back as before (a dial in the
// pipeline, EVAL after NOSCRIPT). Options.NoWarmUp skips it.
func (s *Store) warm(ctx context.Context, c *redis.Client) {
	if s.opts.NoWarmUp {
		return
	}
	addr := c.Options().Addr
	n := s.opts.Pipelines
	if ps := c.Options().PoolSize; ps > 0 {
		n = min(n, ps) // holding more would wait for the pool
	}
	held := make([]*redis.Conn, 0, n)
	defer func() {
		for _, cn := range held {
			_ = cn.Close() // back to the pool, open
		}
	}()
	for range n {
		cn := c.Conn()
		if err := cn.Ping(ctx).Err(); err != nil {
			_ = cn.Close()
			s.opts.Logger.Warn("redis shard: could not open a connection ahead of the first calls", "shard", addr, "err", err)
			return
		}
		held = append(held, cn)
	}
	// One round trip for all the scripts, on a connection held (the pool
	// may have none to spare). Not Script.Load on the pipeline: it would
	// take the not yet executed command's empty value for the hash.
	pl := held[0].Pipeline()
	for _, sc := range storeScripts {
		pl.ScriptLoad(ctx, lua.Source(sc))
	}
	if _, err := pl.Exec(ctx); err != nil {
		s.opts.Logger.Warn("redis shard: could not load the scripts ahead of the first calls", "shard", addr, "err", err)
	}
}

func clientOptions(addr string, opts Options, dial func(context.Context, string, string) (net.Conn, error)) *redis.Options {
	return &redis.Options{
		Addr:         addr,
		Username:     opts.Username,
		Password:     opts.Password,
		TLSConfig:    opts.TLSConfig,
		DialTimeout:  opts.DialTimeout,
		ReadTimeout:  opts.ReadTimeout,
		WriteTimeout: opts.WriteTimeout,
		PoolSize:     opts.PoolSize,
		// A script whose reply was lost may have run; retrying could take
		// twice. The caller sees the error and decides.
		MaxRetries: -1,
		// Every pipeline carries a deadline (MaxWait) and the socket, the
		// dial and the pool wait must all obey it: a read deadline from
		// ctx, one dial attempt (the default retries five times with
		// 100 ms pauses), and a pool wait no longer than a call may wait.
		// Stalls are judged by the shard (shard.check), not by socket
		// deadlines, so a busy node does not close healthy connections.
		ContextTimeoutEnabled: true,
		DialerRetries:         1,
		PoolTimeout:           opts.MaxWait,
		Dialer:                dial,
		// Pipelines share the main pool, whose connection Open warmed,
		// instead of a dedicated pool that dials on the first call.
		PipelinePoolSize: -1,
	}
}

func clusterEnabled(ctx context.Context, c *redis.Client) (bool, error) {
	info, err := c.Info(ctx, "cluster").Result()
	if err != nil {
		return false, fmt.Errorf("INFO cluster: %w", err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cluster_enabled:"); ok {
			return v == "1", nil
		}
	}
	return false, nil // servers built without cluster support omit the field
}

// Client returns the underlying go-redis client (a *redis.Client or a
// *redis.ClusterClient) for packages that need other commands.
func (s *Store) Client() redis.UniversalClient { return s.client }

// Timeout is the least stall threshold (Options.Timeout, after defaults).
func (s *Store) Timeout() time.Duration { return s.opts.Timeout }

// Cluster reports whether the store talks to a Redis Cluster.
func (s *Store) Cluster() bool { return s.cluster }

// Close stops the shards' timers, closes all connections and waits for
// the pipelines and probes in flight (they fail at once on the closed
// client).
func (s *Store) Close() error {
	s.mu.Lock()
	already := s.closed.Swap(true)
	s.mu.Unlock()
	if already {
		return nil
	}
	s.mu.RLock()
	for _, sh := range s.shards {
		sh.stop()
	}
	s.mu.RUnlock()
	err := s.client.Close()
	close(s.done)
	s.wg.Wait()
	if err != nil {
		return fmt.Errorf("region: close: %w", err)
	}
	return nil
}

// Take runs check.lua once per group, all groups in one pipelined round
// trip (a cluster client splits it per node). Each group is taken
// all-or-nothing; groups are independent of each other, so the caller
// refunds the allowed groups (Refund) when another group denied.
//
// An empty group is allowed without touching Redis. On error no Results
// are returned, but groups other than the failing one may have been
// taken: that errs on the side of counting too much.
func (s *Store) Take(ctx context.Context, groups []algorithm.Group) ([]algorithm.Result, error) {
	cmds, err := s.run(ctx, checkScript(groups...), groups)
	if err != nil {
		return nil, fmt.Errorf("region: take: %w", err)
	}
	results := make([]algorithm.Result, len(groups))
	var errs []error
	for i, g := range groups {
		if len(g) == 0 {
			results[i] = algorithm.Result{Allowed: true}
			continue
		}
		r, err := parseCheck(cmds[i], len(g))
		if err != nil {
			errs = append(errs, fmt.Errorf("group %d (%s): %w", i, g[0].Key, err))
			continue
		}
		results[i] = r
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("region: take: %w", err)
	}
	return results, nil
}

// Refund runs refund.lua once per group, in one pipelined round trip: each
// existing bucket gets its item's cost back (capped at capacity). Pass the
// groups exactly as they were passed to a Take that allowed them.
func (s *Store) Refund(ctx context.Context, groups []algorithm.Group) error {
	cmds, err := s.run(ctx, lua.Refund, groups)
	if err != nil {
		return fmt.Errorf("region: refund: %w", err)
	}
	var errs []error
	for i, g := range groups {
		if len(g) == 0 {
			continue
		}
		if err := cmds[i].Err(); err != nil {
			errs = append(errs, fmt.Errorf("group %d (%s): %w", i, g[0].Key, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("region: refund: %w", err)
	}
	return nil
}

// run sends script once per non-empty group with EVALSHA in one pipeline;
// groups whose EVALSHA failed with NOSCRIPT (the script did not run, e.g.
// after SCRIPT FLUSH or a failover) are sent again with EVAL, which also
// reloads the cache. cmds[i] is nil for empty groups. Per-command errors
// are left in the commands; only argument errors are returned.
func (s *Store) run(ctx context.Context, script *redis.Script, groups []algorithm.Group) ([]*redis.Cmd, error) {
	keys := make([][]string, len(groups))
	args := make([][]any, len(groups))
	for i, g := range groups {
		if len(g) == 0 {
			continue
		}
		var err error
		if keys[i], args[i], err = s.specs.scriptArgs(g); err != nil {
			return nil, fmt.Errorf("group %d: %w", i, err)
		}
	}
	return s.evalAll(ctx, script, keys, args), nil
}

// scriptArgs lays a group out as check.lua and refund.lua expect: the keys,
// and 5 ARGV per key. It rejects what would silently misbehave in Redis.
func (sa *specArgs) scriptArgs(g algorithm.Group) ([]string, []any, error) {
	keys := make([]string, len(g))
	args := make([]any, 0, len(g)*lua.ArgsPerKey)
	tag := hashTag(g[0].Key)
	for i, it := range g {
		sp, err := sa.of(it.Spec)
		if err != nil {
			return nil, nil, fmt.Errorf("key %q: %w", it.Key, err)
		}
		switch {
		case it.Cost < 0:
			return nil, nil, fmt.Errorf("key %q: cost %d must not be negative", it.Key, it.Cost)
		case slices.Contains(keys[:i], it.Key):
			// Two items on one bucket would each be checked against the
			// same tokens and the second write would hide the first take.
			return nil, nil, fmt.Errorf("key %q appears twice in one group", it.Key)
		case hashTag(it.Key) != tag:
			// A cluster would refuse the call (CROSSSLOT); refuse it on a
			// single server too, so a deployment change cannot break it.
			return nil, nil, fmt.Errorf("keys %q and %q do not share a hash tag", g[0].Key, it.Key)
		}
		keys[i] = it.Key
		args = append(args, sp...)
		args = append(args, it.Cost)
	}
	return keys, args, nil
}

// specArgs boxes each spec's four script arguments (algorithm code,
// limit, period in ms, burst) once: a check would otherwise allocate
// three interface values per key, though a node's checks are of a few
// policies. Only specs that passed Validate are kept, so a kept spec is
// not validated again per check. At most maxSpecArgs specs are kept
// (policies reload; a spec past the bound is validated and boxed per
// call, as before).
type specArgs struct {
	m sync.Map // algorithm.Spec -> []any
	n atomic.Int32
}

const maxSpecArgs = 4096

// of returns sp's boxed script arguments, or Validate's error. Validate
// also rejects sub-millisecond periods: the scripts take milliseconds,
// and Redis and package algorithm would disagree.
func (sa *specArgs) of(sp algorithm.Spec) ([]any, error) {
	if v, ok := sa.m.Load(sp); ok {
		return v.([]any), nil
	}
	if err := sp.Validate(); err != nil {
		return nil, err
	}
	a := []any{sp.Algorithm.Code(), sp.Limit, sp.Period.Milliseconds(), sp.Capacity()}
	if sa.n.Load() < maxSpecArgs {
		if _, loaded := sa.m.LoadOrStore(sp, a); !loaded {
			sa.n.Add(1)
		}
	}
	return a, nil
}

// hashTag is the part of key Redis Cluster hashes: the text between the
// first '{' and the next '}', if non-empty, else the whole key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// parseCheck turns check.lua's reply into a Result.
func parseCheck(cmd *redis.Cmd, n int) (algorithm.Result, error) {
	// Read in place (not Int64Slice: a copy per check).
	vals, err := cmd.Slice()
	if err != nil {
		return algorithm.Result{}, err
	}
	if len(vals) != 1+3*n {
		return algorithm.Result{}, fmt.Errorf("check.lua returned %d values for %d keys", len(vals), n)
	}
	var bad error
	num := func(i int) int64 {
		v, ok := vals[i].(int64)
		if !ok && bad == nil {
			bad = fmt.Errorf("check.lua returned %T %v at %d, want an integer", vals[i], vals[i], i)
		}
		return v
	}
	r := algorithm.Result{Allowed: num(0) == 1, Items: make([]algorithm.ItemResult, n)}
	for i := range n {
		r.Items[i] = algorithm.ItemResult{
			Remaining:  num(1 + 3*i),
			RetryAfter: micros(num(2 + 3*i)),
			ResetAfter: micros(num(3 + 3*i)),
		}
	}
	if bad != nil {
		return algorithm.Result{}, bad
	}
	return r, nil
}

func micros(us int64) time.Duration {
	if us < 0 {
		return algorithm.Never
	}
	return time.Duration(us) * time.Microsecond
}

// StoreStats are counts since the store opened.
type StoreStats struct {
	Pipelines int64 // round trips sent
	Calls     int64 // store calls sent in them, one per group (a round trip's token-bucket checks share one EVALSHA)
	Stalls    int64 // times a shard was judged stalled
	Shed      int64 // calls shed (queue full, or not sent within MaxWait)
}

// Stats reports the store's counters.
func (s *Store) Stats() StoreStats {
	return StoreStats{
		Pipelines: s.stats.pipelines.Load(),
		Calls:     s.stats.calls.Load(),
		Stalls:    s.stats.stalls.Load(),
		Shed:      s.stats.shed.Load(),
	}
}
