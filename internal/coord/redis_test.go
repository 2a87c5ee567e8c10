package coord

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/rebalance"
)

func redisClient(t *testing.T) *redis.Client {
	t.Helper()
	in := redistest.Server(t)
	c := redis.NewClient(&redis.Options{Addr: in.Addr, Protocol: 2})
	t.Cleanup(func() { c.Close() })
	return c
}

func TestRedisWriterRefillsAtTheOldRateThenCaps(t *testing.T) {
	ctx := context.Background()
	c := redisClient(t)
	w := RedisWriter{Client: c}
	global := Limit{Rate: 300, Burst: 300}
	key := "rl:{tenant=a}:global:rps"
	// A bucket at 10 tokens, last refilled "now" at 100/s (the default
	// third), burst 100.
	tm, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	c.HSet(ctx, key, "tokens", 10, "ts", tm.UnixMicro())
	half := rebalance.Unit / 2
	if err := w.WriteShares(ctx, []ShareUpdate{{Key: key, Share: half, Global: global, Old: Limit{Rate: 100, Burst: 100}, TTL: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	h, err := c.HGetAll(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if h["rate"] != "150" || h["burst"] != "150" {
		t.Fatalf("share not written: %v", h)
	}
	// Refilled at the old 100/s for the few ms the call took: about 10.
	if tok := mustFloat(t, h["tokens"]); tok < 10 || tok > 12 {
		t.Fatalf("tokens %v: want the old rate's refill, about 10", tok)
	}
	if ttl := c.PTTL(ctx, key).Val(); ttl < 59*time.Second {
		t.Fatalf("ttl %v", ttl)
	}
	// A shrink caps the bucket at the new burst at once.
	c.HSet(ctx, key, "tokens", 150)
	tenth := rebalance.Unit / 10
	if err := w.WriteShares(ctx, []ShareUpdate{{Key: key, Share: tenth, Global: global, Old: Limit{Rate: 150, Burst: 150}, TTL: time.Second}}); err != nil {
		t.Fatal(err)
	}
	h = c.HGetAll(ctx, key).Val()
	if mustFloat(t, h["tokens"]) != 30 || h["burst"] != "30" {
		t.Fatalf("shrink not capped: %v", h)
	}
	// The TTL is never shortened.
	if ttl := c.PTTL(ctx, key).Val(); ttl < 58*time.Second {
		t.Fatalf("ttl shortened to %v", ttl)
	}
	got, err := w.ReadShares(ctx, []string{key, "rl:{x}:global:rps"}, StaticLimits{"global:rps": global})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[key] != tenth {
		t.Fatalf("ReadShares = %v, want %s: %d", got, key, tenth)
	}
	// After SCRIPT FLUSH the writer re-runs with EVAL.
	c.ScriptFlush(ctx)
	if err := w.WriteShares(ctx, []ShareUpdate{{Key: key, Share: half, Global: global, Old: Limit{Rate: 30, Burst: 30}, TTL: time.Minute}}); err != nil {
		t.Fatalf("after SCRIPT FLUSH: %v", err)
	}
}

func mustFloat(t *testing.T, s string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return v
}

func TestRedisLockElectsOneAndHandsOver(t *testing.T) {
	ctx := context.Background()
	c := redisClient(t)
	a := &RedisLock{Client: c, Key: "allot:coordinator:{eu}", ID: "a", TTL: 300 * time.Millisecond}
	b := &RedisLock{Client: c, Key: "allot:coordinator:{eu}", ID: "b", TTL: 300 * time.Millisecond}
	if ok, err := a.Hold(ctx); err != nil || !ok {
		t.Fatalf("a: %v %v", ok, err)
	}
	if ok, _ := b.Hold(ctx); ok {
		t.Fatal("b got a held lock")
	}
	if ok, _ := a.Hold(ctx); !ok {
		t.Fatal("a could not renew")
	}
	// a stops renewing: b gets it after the TTL.
	// Redis expires the key: polled, since Redis cannot notify it.
	require.Eventually(t, func() bool { ok, _ := b.Hold(ctx); return ok }, 10*time.Second, 5*time.Millisecond, "b takes over after the TTL")
	if ok, _ := a.Hold(ctx); ok {
		t.Fatal("a re-took b's lock")
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, _ := a.Hold(ctx); !ok {
		t.Fatal("a could not take a released lock")
	}
}
