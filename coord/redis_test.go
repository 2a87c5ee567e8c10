package coord

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/internal/redistest"
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
	eventually(t, 2*time.Second, "b takes over after the TTL", func() bool { ok, _ := b.Hold(ctx); return ok })
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

// TestStandbyTakesOver runs an active and a standby coordinator for eu
// (with a real Redis lock) next to ap and us; stopping the active hands
// eu to the standby, which picks up eu's shares from the ledger and goes
// on rebalancing.
func TestStandbyTakesOver(t *testing.T) {
	c := redisClient(t)
	regions := []string{"ap", "eu", "us"}
	hub := NewHub()
	led := newLedger(t, regions)
	demand := map[string]*rateDemand{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	start := func(ctx context.Context, region, id string) *Coordinator {
		var lock Locker
		if region == "eu" {
			lock = &RedisLock{Client: c, Key: "allot:coordinator:{eu}", ID: id, TTL: 250 * time.Millisecond}
		}
		co, err := New(Config{Region: region, Regions: regions, Transport: hub.Join(region), Demand: demand[region],
			Writer: led.writer(region), Limits: testLimits, Lock: lock, Knobs: testKnobs(), Logger: testLogger(t).With("id", id)})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { _ = co.Run(ctx) })
		return co
	}
	for _, r := range regions {
		demand[r] = newRateDemand()
	}
	setDemand := func(rates ...float64) {
		for i, r := range regions {
			demand[r].set(testKey, rates[i])
		}
	}
	shares := func() []rebalance.Share {
		return []rebalance.Share{led.share("ap", testKey), led.share("eu", testKey), led.share("us", testKey)}
	}
	start(ctx, "ap", "ap")
	start(ctx, "us", "us")
	activeCtx, stopActive := context.WithCancel(ctx)
	active := start(activeCtx, "eu", "eu-1")
	eventually(t, 2*time.Second, "eu-1 active", func() bool { return active.Stats().Epoch != 0 })
	standby := start(ctx, "eu", "eu-2")
	setDemand(20, 360, 20)
	eventually(t, 3*time.Second, "shifted to eu", func() bool { return near(shares(), []float64{20. / 300, 260. / 300, 20. / 300}, 0.01) })
	if standby.Stats().Epoch != 0 {
		t.Fatal("the standby acted while the active held the lock")
	}
	stopActive()
	setDemand(20, 20, 360)
	eventually(t, 3*time.Second, "standby took over and shifted to us", func() bool {
		return near(shares(), []float64{20. / 300, 20. / 300, 260. / 300}, 0.01)
	})
	if standby.Stats().Epoch == 0 {
		t.Fatal("the standby never ran an epoch")
	}
}

// An active coordinator keeps its lock through an interval longer than the
// lock's TTL: it renews while it waits, so the standby never acts.
func TestActiveKeepsALockShorterThanTheInterval(t *testing.T) {
	c := redisClient(t)
	regions := []string{"a", "b"}
	hub := NewHub()
	led := newLedger(t, regions)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	k := testKnobs()
	k.Interval = 600 * time.Millisecond
	k.ShareTTL = 2 * k.Interval
	start := func(region, id string) *Coordinator {
		var lock Locker
		if region == "a" {
			lock = &RedisLock{Client: c, Key: "allot:coordinator:{a}", ID: id, TTL: 150 * time.Millisecond}
		}
		co, err := New(Config{Region: region, Regions: regions, Transport: hub.Join(region), Demand: newRateDemand(),
			Writer: led.writer(region), Limits: testLimits, Lock: lock, LockRenew: 50 * time.Millisecond, Knobs: k,
			Logger: testLogger(t).With("id", id)})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { _ = co.Run(ctx) })
		return co
	}
	start("b", "b")
	active := start("a", "a-1")
	eventually(t, 5*time.Second, "a-1 active", func() bool { return active.Stats().Rounds > 0 })
	standby := start("a", "a-2")
	before := active.Stats().Rounds
	eventually(t, 10*time.Second, "three more epochs", func() bool { return active.Stats().Rounds >= before+3 })
	if n := standby.Stats().Rounds; n != 0 {
		t.Fatalf("the standby ran %d epochs as the active one while a-1 held the lock", n)
	}
}
