package coord

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/lua"
	"github.com/allot-dev/allot/rebalance"
)

// ShareWriter applies a region's shares to its buckets.
type ShareWriter interface {
	// WriteShares applies every update. On error some may have been
	// applied and others not.
	WriteShares(ctx context.Context, us []ShareUpdate) error
	// ReadShares returns the share in force for each key (rounded up, so
	// a new active coordinator never under-estimates what its region
	// holds); a key without one has the default and is left out.
	ReadShares(ctx context.Context, keys []string, limits Limits) (map[string]rebalance.Share, error)
}

// ShareUpdate is one key's new share.
type ShareUpdate struct {
	Key   string
	Share rebalance.Share
	// Global is the key's global limit; the share's rate and burst are
	// its Share of it. Old is what the bucket enforces while it holds no
	// share (the lease script's fallback), used to refill at the old rate.
	Global Limit
	Old    Limit
	TTL    time.Duration
}

// RedisWriter writes shares into the region's Redis hashes, the buckets
// whose scripts read them (check.lua, check_tb.lua, refund.lua,
// lease.lua, part.lua). Keys are hash-tagged, so a Cluster client routes
// each to its slot.
type RedisWriter struct {
	Client redis.UniversalClient
}

// WriteShares implements ShareWriter: one pipelined round trip (per
// cluster node) of share.lua calls. The script is idempotent (it sets
// numbers and refills to now), so a NOSCRIPT reply is simply re-run with
// EVAL.
func (w RedisWriter) WriteShares(ctx context.Context, us []ShareUpdate) error {
	err := runPipelined(ctx, w.Client, lua.Share, len(us), func(i int) (string, []any) {
		return us[i].Key, ShareArgs(us[i])
	})
	if err != nil {
		return fmt.Errorf("coord: write shares: %w", err)
	}
	return nil
}

// ShareArgs is share.lua's ARGV for u, as WriteShares sends it (and the
// simulator, internal/tools/sim, runs it): the new rate and burst, the
// rate and burst in force without a share, the TTL in ms.
func ShareArgs(u ShareUpdate) []any {
	return []any{
		ftoa(u.Share.Of(u.Global.Rate)), ftoa(u.Share.Of(u.Global.Burst)),
		ftoa(u.Old.Rate), ftoa(u.Old.Burst), u.TTL.Milliseconds(),
	}
}

// runPipelined runs script once for each of n calls (call(i) gives its key
// and arguments) in one pipelined round trip, with EVALSHA; calls answered
// NOSCRIPT (a restarted or failed-over Redis) are re-run with EVAL. The
// coordinator's scripts are idempotent, so a re-run is harmless.
func runPipelined(ctx context.Context, c redis.UniversalClient, script *redis.Script, n int, call func(i int) (string, []any)) error {
	if n == 0 {
		return nil
	}
	run := func(eval bool, todo []int) ([]redis.Cmder, error) {
		pipe := c.Pipeline()
		for _, i := range todo {
			key, args := call(i)
			if eval {
				script.Eval(ctx, pipe, []string{key}, args...)
			} else {
				script.EvalSha(ctx, pipe, []string{key}, args...)
			}
		}
		return pipe.Exec(ctx)
	}
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	cmds, err := run(false, all)
	if err == nil {
		return nil
	}
	var retry []int
	var errs []error
	for i, cmd := range cmds {
		if e := cmd.Err(); e != nil {
			if strings.HasPrefix(e.Error(), "NOSCRIPT") {
				retry = append(retry, i)
			} else {
				key, _ := call(i)
				errs = append(errs, fmt.Errorf("%s: %w", key, e))
			}
		}
	}
	if len(cmds) == 0 {
		errs = append(errs, err)
	}
	if len(retry) > 0 {
		if _, err := run(true, retry); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ReadShares implements ShareWriter.
func (w RedisWriter) ReadShares(ctx context.Context, keys []string, limits Limits) (map[string]rebalance.Share, error) {
	pipe := w.Client.Pipeline()
	cmds := make([]*redis.StringCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.HGet(ctx, k, "rate")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("coord: read shares: %w", err)
	}
	out := map[string]rebalance.Share{}
	for i, c := range cmds {
		v, err := c.Float64()
		if err != nil {
			continue // no share: the default
		}
		l, ok := limits.Global(keys[i])
		if !ok {
			continue
		}
		if s, ok := ShareOfRate(v, l); ok {
			out[keys[i]] = s
		}
	}
	return out, nil
}

// ShareOfRate is the share a bucket's stored rate v is of global limit l,
// rounded up (a new active coordinator never under-estimates what its
// region holds), as ReadShares reads it; false when l has no rate.
func ShareOfRate(v float64, l Limit) (rebalance.Share, bool) {
	if l.Rate <= 0 {
		return 0, false
	}
	s := math.Ceil(v / l.Rate * float64(rebalance.Unit))
	return rebalance.Share(min(s, float64(rebalance.Unit))), true
}

func ftoa(v float64) string { return strconv.FormatFloat(v, 'g', 17, 64) }

// RedisLock elects one active coordinator per region: SET key id NX PX
// ttl, renewed by its holder with a compare-and-expire. A holder that
// cannot renew within ttl loses the lock to a standby.
type RedisLock struct {
	Client redis.UniversalClient
	Key    string // e.g. allot:coordinator:{eu}
	ID     string // unique per process
	TTL    time.Duration
}

// Hold acquires or renews the lock and reports whether this process holds
// it now.
func (l *RedisLock) Hold(ctx context.Context) (bool, error) {
	n, err := lua.LockHold.Run(ctx, l.Client, []string{l.Key}, LockHoldArgs(l.ID, l.TTL)...).Int()
	if err != nil {
		return false, fmt.Errorf("coord: lock %s: %w", l.Key, err)
	}
	return n == 1, nil
}

// Release gives the lock up if this process holds it, so a standby takes
// over at once instead of after the TTL.
func (l *RedisLock) Release(ctx context.Context) error {
	if err := lua.LockRelease.Run(ctx, l.Client, []string{l.Key}, LockReleaseArgs(l.ID)...).Err(); err != nil {
		return fmt.Errorf("coord: release %s: %w", l.Key, err)
	}
	return nil
}

// LockHoldArgs is lock_hold.lua's ARGV, as Hold sends it (and the
// simulator runs it): the holder's id and the TTL in ms.
func LockHoldArgs(id string, ttl time.Duration) []any { return []any{id, ttl.Milliseconds()} }

// LockReleaseArgs is lock_release.lua's ARGV, as Release sends it: the
// holder's id.
func LockReleaseArgs(id string) []any { return []any{id} }

// ReadCounts implements QuotaStore: one pipelined HMGET per key.
func (w RedisWriter) ReadCounts(ctx context.Context, keys []string) (map[string]QuotaCount, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	pipe := w.Client.Pipeline()
	cmds := make([]*redis.SliceCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.HMGet(ctx, k, "fw_win", "fw_n")
	}
	_, err := pipe.Exec(ctx)
	out := make(map[string]QuotaCount, len(keys))
	for i, c := range cmds {
		v, cerr := c.Result()
		if cerr != nil || len(v) != 2 {
			continue // WRONGTYPE (the policy changed algorithm) or a failed shard
		}
		win, e1 := strconv.ParseInt(str(v[0]), 10, 64)
		used, e2 := strconv.ParseUint(str(v[1]), 10, 64)
		if e1 != nil || e2 != nil {
			continue
		}
		out[keys[i]] = QuotaCount{Window: win, Used: used}
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		return out, fmt.Errorf("coord: read quota counts: %w", err)
	}
	return out, nil
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

// WriteRemote implements QuotaStore: one pipelined round trip of
// quota.lua calls (the script only raises numbers, so a NOSCRIPT re-run
// is harmless).
func (w RedisWriter) WriteRemote(ctx context.Context, us []RemoteCount) error {
	err := runPipelined(ctx, w.Client, lua.Quota, len(us), func(i int) (string, []any) {
		u := us[i]
		return u.Key, []any{u.Window, u.Used, u.Period.Milliseconds()}
	})
	if err != nil {
		return fmt.Errorf("coord: write quota counts: %w", err)
	}
	return nil
}
