// Package region is the client of one region's Redis (a single server or a
// Redis Cluster), which holds the authoritative bucket state for the
// region.
//
// It owns: connecting (options.go, dial.go, conn.go; detecting cluster
// mode), turning algorithm Groups (Take, Refund: the decider's
// decide.Store) and lease Groups (Lease, Return: the lease manager's
// lease.Source) into calls of the scripts in package lua, laid out
// straight into their wire commands (args.go, script.go), pipelining
// those calls into one round trip per shard (call.go, pipeline.go), a
// breaker per shard (breaker.go, stall.go, health.go), recovering from a
// flushed script cache and a failover (pipeline.go, failover.go),
// settling RLQS parts (part.go), and decoding replies straight into
// algorithm Results and lease Replies.
//
// It must not: decide policy (which keys, limits or costs apply), keep
// bucket state or a clock of bucket time (the scripts read Redis TIME; the
// store reads time.Now only to judge its shards and connections: stalls,
// breakers, MaxWait, a pooled connection's check), retry a script whose
// reply was lost (it may have run, and a second take would count twice),
// or decide what happens when Redis fails (fail open or closed is the
// caller's call; every failure is returned as an error).
package region

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/lua"
)

// Store runs the bucket scripts on the region's Redis. It is safe for
// concurrent use. Calls are coalesced per shard (pipeline.go): concurrent
// calls bound for one Redis master share round trips.
type Store struct {
	client redis.UniversalClient
	opts   Options
	conns  *conns

	mu     sync.RWMutex
	shards map[string]*shard
	single *shard // the single server's, every call's, found without the lock; nil: a cluster

	wg     sync.WaitGroup // pipeline workers and probes
	done   chan struct{}  // closed by Close: workers exit
	closed atomic.Bool
	hashes sync.Map // *redis.Script -> its hash as an EVALSHA argument (any), boxed once
	specs  specArgs
	dones  doneChans
	stats  struct{ pipelines, calls, stalls, shed atomic.Int64 }
}

func newStore(c redis.UniversalClient, opts Options, cs *conns) *Store {
	return &Store{client: c, opts: opts, conns: cs, shards: map[string]*shard{}, done: make(chan struct{})}
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
		c := redis.NewClient(clientOptions(addrs[:1], opts, dial).Simple())
		enabled, err := clusterEnabled(ctx, c)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("region: open %s: %w", addrs[0], err)
		}
		if !enabled {
			s := newStore(c, opts, cs)
			s.single = s.shard(addrs[0], c) // reported by Shards from the start
			s.warm(ctx, c)
			return s, nil
		}
		c.Close()
		cluster = true
	}
	cc := redis.NewClusterClient(clientOptions(addrs, opts, dial).Cluster())
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
	s := newStore(cc, opts, cs)
	_ = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		s.shard(c.Options().Addr, c) // reported by Shards from the start
		s.warm(ctx, c)
		return nil
	})
	return s, nil
}

// storeScripts are the scripts the store's methods send (run).
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

// clientOptions are the one list of go-redis settings, for a client of
// addrs[0] (Simple) or a cluster client seeded with addrs (Cluster).
func clientOptions(addrs []string, opts Options, dial func(context.Context, string, string) (net.Conn, error)) *redis.UniversalOptions {
	return &redis.UniversalOptions{
		Addrs:        addrs,
		Username:     opts.Username,
		Password:     opts.Password,
		TLSConfig:    opts.TLSConfig,
		DialTimeout:  opts.DialTimeout,
		ReadTimeout:  opts.ReadTimeout,
		WriteTimeout: opts.WriteTimeout,
		PoolSize:     opts.PoolSize,
		// A script whose reply was lost may have run; retrying could take
		// twice. The caller sees the error and decides. A cluster client
		// still follows MOVED/ASK redirects (MaxRedirects): the script did
		// not run on the wrong node.
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
		// Pipelines share the main pool, whose connections Open warmed,
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
func (s *Store) Cluster() bool { return s.single == nil }

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

// Take makes one script call per group: of check_tb.lua (lua.CheckTB) when
// every item of every group is a token bucket, else of check.lua
// (checkScript). The store splits the calls by shard (run) and queues each
// for its shard's next pipeline, with other callers' calls; on a single
// server the token-bucket calls of one pipeline share one CheckTB command
// (wireCalls). Each group is taken all-or-nothing; groups are independent
// of each other, so the caller refunds the allowed groups (Refund) when
// another group denied.
//
// An empty group is allowed without touching Redis. On error no Results
// are returned, but groups other than the failing one may have been
// taken: that errs on the side of counting too much.
func (s *Store) Take(ctx context.Context, groups []algorithm.Group) ([]algorithm.Result, error) {
	r, err := s.runGroups(ctx, checkScript(groups...), groups)
	if err != nil {
		return nil, fmt.Errorf("region: take: %w", err)
	}
	replies := r.replies
	results, items := r.resultRoom(groups)
	var errs []error
	for i, g := range groups {
		if len(g) == 0 {
			results[i] = algorithm.Result{Allowed: true}
			continue
		}
		err := replies[i].err
		if err == nil {
			err = decodeCheck(replies[i].val, &results[i], items[:len(g):len(g)])
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("group %d (%s): %w", i, g[0].Key, err))
		}
		items = items[len(g):]
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("region: take: %w", err)
	}
	return results, nil
}

// resultRoom is the storage of groups' results and their items: the
// request's own for the common take of one group of up to two keys (no
// allocation of its own), two arrays otherwise.
func (r *request) resultRoom(groups []algorithm.Group) ([]algorithm.Result, []algorithm.ItemResult) {
	n := 0
	for _, g := range groups {
		n += len(g)
	}
	if len(groups) == 1 && n <= len(r.items1) {
		return r.result1[:], r.items1[:n]
	}
	return make([]algorithm.Result, len(groups)), make([]algorithm.ItemResult, n)
}

// Refund runs refund.lua once per group, each call queued for its shard's
// next pipeline as Take's are: each existing bucket gets its item's cost
// back (capped at capacity). Pass the groups exactly as they were passed
// to a Take that allowed them.
func (s *Store) Refund(ctx context.Context, groups []algorithm.Group) error {
	r, err := s.runGroups(ctx, lua.Refund, groups)
	if err != nil {
		return fmt.Errorf("region: refund: %w", err)
	}
	replies := r.replies
	var errs []error
	for i, g := range groups {
		if len(g) == 0 {
			continue
		}
		if err := replies[i].err; err != nil {
			errs = append(errs, fmt.Errorf("group %d (%s): %w", i, g[0].Key, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("region: refund: %w", err)
	}
	return nil
}

// runGroups sends script once per non-empty group (run), each group laid
// out into its wire command when its pipeline is sent, and returns the
// answered request: replies[i] is the zero reply for an empty group.
// Only argument errors are returned: nothing was sent then.
func (s *Store) runGroups(ctx context.Context, script *redis.Script, groups []algorithm.Group) (*request, error) {
	for i, g := range groups {
		if len(g) == 0 {
			continue
		}
		if err := s.specs.checkGroup(g); err != nil {
			return nil, fmt.Errorf("group %d: %w", i, err)
		}
	}
	r := newRequest(script, len(groups))
	for i, g := range groups {
		r.calls[i].group = g
	}
	s.run(ctx, r)
	return r, nil
}

// runArgs sends script once per non-nil keys[i], with args[i] (run).
func (s *Store) runArgs(ctx context.Context, script *redis.Script, keys [][]string, args [][]any) []reply {
	r := newRequest(script, len(keys))
	for i := range keys {
		r.calls[i].keys, r.calls[i].args = keys[i], args[i]
	}
	return s.run(ctx, r)
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
