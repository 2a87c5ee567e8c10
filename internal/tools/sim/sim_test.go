package sim

import (
	"bytes"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/allot-dev/allot/lease"
)

var (
	long  = flag.Bool("sim.long", false, "run the long property set (200 scenarios)")
	first = flag.Int("sim.first", 1, "the property set's first seed")
)

func run(t *testing.T, c Config) *Result {
	t.Helper()
	r, err := Run(c)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func output(t *testing.T, r *Result) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := r.Write(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// faulty is a small scenario with every fault, a shift and a Zipf key set.
func faulty() Config {
	c := Default()
	c.Duration, c.Regions, c.Nodes, c.Keys, c.Rate = 32*time.Second, 3, 4, 50, 1000
	c.Interval = 2 * time.Second
	c.ShiftAt, c.ShiftTo = 12*time.Second, []float64{0.8, 0.1, 0.1}
	c.Crashes = []Crash{{Region: 0, Node: 1, At: 15 * time.Second}}
	c.Partitions = []Partition{{Region: 2, From: 20 * time.Second, To: 28 * time.Second},
		{Region: 0, Peer: 1, Link: true, Dir: Out, From: 13 * time.Second, To: 16 * time.Second}}
	c.Failovers = []Failover{{Region: 1, At: 30 * time.Second, Loss: 200 * time.Millisecond}}
	c.CoordFailovers = []CoordFailover{{Region: 2, At: 9 * time.Second, After: time.Second}}
	c.Jitter = Jitter{Node: time.Millisecond, Coord: 2 * time.Millisecond, Region: 30 * time.Millisecond}
	c.Loss = Loss{Drop: 0.05, Dup: 0.05, Reorder: 0.1, Hold: 100 * time.Millisecond}
	c.Skew = Skew{Redis: 200 * time.Millisecond, Node: 50 * time.Millisecond, Coord: time.Second}
	c.Outages = []Outage{{Region: 0, From: 17 * time.Second, To: 19 * time.Second}}
	c.OnStoreFailure = FailLocal
	c.Restarts = []Restart{{Region: 1, Node: 2, At: 14 * time.Second, Back: 18 * time.Second}}
	c.Joins = []Join{{Region: 0, At: 20 * time.Second}}
	c.Overlaps = []Overlap{{Region: 1, From: 21 * time.Second, To: 25 * time.Second}}
	c.Away = Away{For: 300 * time.Millisecond, Every: time.Second, From: 12 * time.Second}
	return c
}

// faultyRun is faulty's run, shared by the tests that read it.
var faultyRun = sync.OnceValues(func() (*Result, error) { return Run(faulty()) })

func faultyResult(t *testing.T) *Result {
	t.Helper()
	r, err := faultyRun()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Same configuration, same bytes: nothing but the event queue decides.
func TestSameSeedSameOutput(t *testing.T) {
	a, b := output(t, faultyResult(t)), output(t, run(t, faulty()))
	if !bytes.Equal(a, b) {
		t.Fatalf("two runs differ:\n%s\n%s", a, b)
	}
	c, d := faulty(), faulty()
	c.Seed++
	c.Duration, d.Duration = 10*time.Second, 10*time.Second
	if bytes.Equal(output(t, run(t, d)), output(t, run(t, c))) {
		t.Fatal("another seed gave the same output: the seed is not used")
	}
}

// The faults happen: a crash strands its leases, a failover loses writes,
// messages are dropped, duplicated and held back, a node restarts, a
// Redis outage is decided by the local fallback.
func TestFaultsTakeEffect(t *testing.T) {
	r := faultyResult(t)
	if r.Stranded <= 0 {
		t.Errorf("the crashed node stranded %d tokens, want > 0", r.Stranded)
	}
	if r.LostWrites <= 0 {
		t.Errorf("the failover lost %d writes, want > 0", r.LostWrites)
	}
	if r.Epochs == 0 {
		t.Error("no coordinator epoch finished")
	}
	if r.MessagesDropped == 0 || r.MessagesDuplicated == 0 || r.MessagesHeldBack == 0 {
		t.Errorf("messages dropped %d, duplicated %d, held back %d: want each > 0", r.MessagesDropped, r.MessagesDuplicated, r.MessagesHeldBack)
	}
	if r.Restarts != 1 {
		t.Errorf("%d restarts, want 1", r.Restarts)
	}
	if r.StoreFailureDecisions == 0 || r.OutsideLocal == 0 || r.OutsideOpen != 0 {
		t.Errorf("outage: %d decided by on_store_failure local, %d admitted local, %d open: want > 0, > 0, 0",
			r.StoreFailureDecisions, r.OutsideLocal, r.OutsideOpen)
	}
}

// A Redis outage is decided by the policy's on_store_failure: closed
// admits nothing more, open everything asked of the region, local the
// region's numbers spread over its live nodes; the theorem's bound
// holds on what Redis and its leases admitted, and what open admitted
// breaks it when counted in (max_overshoot_with_outside), where local's
// stays within a few percent of it.
func TestOutageOnStoreFailure(t *testing.T) {
	got := map[string]*Result{}
	for _, mode := range []string{FailOpen, FailClosed, FailLocal} {
		c := Default()
		c.Duration, c.Nodes, c.Rate = 30*time.Second, 4, 1500
		c.Outages = []Outage{{Region: 0, From: 10 * time.Second, To: 20 * time.Second}}
		c.OnStoreFailure = mode
		r := run(t, c)
		got[mode] = r
		t.Logf("%s: %d decided by on_store_failure, %d admitted open, %d local; covered %.4f, with them %.4f of the bound",
			mode, r.StoreFailureDecisions, r.OutsideOpen, r.OutsideLocal, r.MaxOvershootOverBound, r.MaxOvershootWithOutside)
		if r.StoreFailureDecisions == 0 {
			t.Errorf("%s: nothing decided by on_store_failure", mode)
		}
		if r.MaxOvershootOverBound > 0 {
			t.Errorf("%s: the covered admissions broke the bound: %.4f (%s)", mode, r.MaxOvershootOverBound, r.WorstWindow)
		}
	}
	open, closed, local := got[FailOpen], got[FailClosed], got[FailLocal]
	assert.Zero(t, closed.OutsideAdmissions)
	assert.Equal(t, closed.MaxOvershootOverBound, closed.MaxOvershootWithOutside)
	assert.Zero(t, open.OutsideLocal)
	assert.Zero(t, local.OutsideOpen)
	// us asks 1,000/s of its 100/s for 10 s: open admits what the
	// managers do not deny from their pacing (about half), far past the
	// bound.
	assert.Greater(t, open.OutsideOpen, int64(3000))
	assert.Greater(t, open.MaxOvershootWithOutside, 0.2)
	// local: us's 100/s over its 4 nodes, for 10 s.
	assert.InDelta(t, 1000, float64(local.OutsideLocal), 150)
	assert.Less(t, local.MaxOvershootWithOutside, 0.1)
}

// The fault flags' syntax.
func TestParseFaults(t *testing.T) {
	ps, err := ParsePartitions("1@1s-2s,0<>2@3s-4s,0>2@5s-6s,1>*@7s-8s,*>2@9s-10s")
	if assert.NoError(t, err) {
		assert.Equal(t, []Partition{
			{Region: 1, From: time.Second, To: 2 * time.Second},
			{Region: 0, Peer: 2, Link: true, From: 3 * time.Second, To: 4 * time.Second},
			{Region: 0, Peer: 2, Link: true, Dir: Out, From: 5 * time.Second, To: 6 * time.Second},
			{Region: 1, Dir: Out, From: 7 * time.Second, To: 8 * time.Second},
			{Region: 2, Dir: In, From: 9 * time.Second, To: 10 * time.Second},
		}, ps)
		cuts := func(p Partition, a, b int) bool { return p.cuts(a, b) }
		assert.True(t, cuts(ps[0], 1, 0) && cuts(ps[0], 2, 1) && !cuts(ps[0], 0, 2))
		assert.True(t, cuts(ps[1], 0, 2) && cuts(ps[1], 2, 0) && !cuts(ps[1], 0, 1))
		assert.True(t, cuts(ps[2], 0, 2) && !cuts(ps[2], 2, 0))
		assert.True(t, cuts(ps[3], 1, 0) && cuts(ps[3], 1, 2) && !cuts(ps[3], 0, 1))
		assert.True(t, cuts(ps[4], 0, 2) && cuts(ps[4], 1, 2) && !cuts(ps[4], 2, 0))
	}
	j, err := ParseJitter("5ms")
	assert.NoError(t, err)
	assert.Equal(t, Jitter{5 * time.Millisecond, 5 * time.Millisecond, 5 * time.Millisecond}, j)
	j, err = ParseJitter("node=1ms,region=30ms")
	assert.NoError(t, err)
	assert.Equal(t, Jitter{Node: time.Millisecond, Region: 30 * time.Millisecond}, j)
	l, err := ParseLoss("drop=0.05,dup=0.02,reorder=0.1,hold=50ms")
	assert.NoError(t, err)
	assert.Equal(t, Loss{Drop: 0.05, Dup: 0.02, Reorder: 0.1, Hold: 50 * time.Millisecond}, l)
	l, err = ParseLoss("0.1")
	assert.NoError(t, err)
	assert.Equal(t, Loss{Drop: 0.1, Hold: 100 * time.Millisecond}, l)
	sk, err := ParseSkew("redis=200ms,coord=1s")
	assert.NoError(t, err)
	assert.Equal(t, Skew{Redis: 200 * time.Millisecond, Coord: time.Second}, sk)
	rs, err := ParseRestarts("0/3@40s-55s")
	assert.NoError(t, err)
	assert.Equal(t, []Restart{{Region: 0, Node: 3, At: 40 * time.Second, Back: 55 * time.Second}}, rs)
	js, err := ParseJoins("2@45s,2@50s")
	assert.NoError(t, err)
	assert.Equal(t, []Join{{Region: 2, At: 45 * time.Second}, {Region: 2, At: 50 * time.Second}}, js)
	os, err := ParseOverlaps("0@35s-50s")
	assert.NoError(t, err)
	assert.Equal(t, []Overlap{{Region: 0, From: 35 * time.Second, To: 50 * time.Second}}, os)
	a, err := ParseAway("450ms/2s@30s-60s")
	assert.NoError(t, err)
	assert.Equal(t, Away{For: 450 * time.Millisecond, Every: 2 * time.Second, From: 30 * time.Second, To: time.Minute}, a)
	a, err = ParseAway("450ms/2s")
	assert.NoError(t, err)
	assert.Equal(t, Away{For: 450 * time.Millisecond, Every: 2 * time.Second}, a)
	// Node 1 of 4 takes its turn half a second into each 2 s, for 450 ms.
	assert.False(t, a.away(1, 4, 499*time.Millisecond))
	assert.True(t, a.away(1, 4, 500*time.Millisecond))
	assert.True(t, a.away(1, 4, 2949*time.Millisecond))
	assert.False(t, a.away(1, 4, 2950*time.Millisecond))
	assert.False(t, a.away(0, 4, 1900*time.Millisecond))
	for _, bad := range []func() error{
		func() error { _, err := ParseAway("450ms"); return err },
		func() error { _, err := ParseAway("450ms/x"); return err },
		func() error { _, err := ParsePartitions("1>@1s-2s"); return err },
		func() error { _, err := ParsePartitions("1<>x@1s-2s"); return err },
		func() error { _, err := ParseJitter("wan=1ms"); return err },
		func() error { _, err := ParseLoss("drop=x"); return err },
		func() error { _, err := ParseRestarts("0/1@5s"); return err },
		func() error { _, err := ParseJoins("1@5s-6s"); return err },
	} {
		assert.Error(t, bad())
	}
}

// After an even-to-90 % shift the coordinators move the hot key's shares:
// in the 2nd interval after, us gets more than its default third, and the
// whole run admits near the ideal bucket.
func TestShiftRebalances(t *testing.T) {
	c := Default()
	c.Duration, c.Rate, c.ShiftAt, c.ShiftTo = 70*time.Second, 1500, 30*time.Second, []float64{0.9, 0.05, 0.05}
	r := run(t, c)
	if len(r.Intervals) != 4 {
		t.Fatalf("intervals %+v", r.Intervals)
	}
	if got := r.Intervals[3].RegionsPer[0]; got < 115 {
		t.Errorf("us admits %.1f/s two intervals after the shift, want well above its default 100/s", got)
	}
	if r.Intervals[0].OfL < 0.95 {
		t.Errorf("before the shift %.3f of L, want >= 0.95", r.Intervals[0].OfL)
	}
	// The epoch one interval after the shift sees it whole (the demand of
	// the interval's last 3 s) and the quiet regions keep 5 % over their
	// demand: 95.2 % and 97.4 % of L at this seed, where averaging the
	// whole interval with 10 % headroom gave 83.5 % and 94.3 %.
	if got := r.Intervals[2].OfL; got < 0.93 {
		t.Errorf("2nd interval after the shift %.3f of L, want >= 0.93", got)
	}
	if got := r.Intervals[3].OfL; got < 0.96 {
		t.Errorf("from two intervals after the shift %.3f of L, want >= 0.96", got)
	}
	if r.MaxOvershootOverBound > 0 || r.MaxShareSum > 1 {
		t.Errorf("bound broken: %+v", r)
	}
}

// A partitioned region keeps its share: no region grows into it, so the
// shares still sum to at most L, and the bound holds.
func TestPartitionKeepsTheBound(t *testing.T) {
	c := Default()
	c.Duration, c.Rate, c.Interval = 60*time.Second, 2000, 2*time.Second
	c.ShiftAt, c.ShiftTo = 10*time.Second, []float64{0.1, 0.1, 0.8}
	c.Partitions = []Partition{{Region: 2, From: 5 * time.Second, To: 40 * time.Second}}
	r := run(t, c)
	if r.MaxShareSum > 1 || r.MaxOvershootOverBound > 0 {
		t.Fatalf("share sum %v, overshoot %v", r.MaxShareSum, r.MaxOvershootOverBound)
	}
}

// randomScenario draws a scenario: regions, nodes, keys, distribution,
// rate, knobs, a shift or ramp, a flash crowd, crashes, coordinator
// failovers and partitions (no failover: a Redis losing writes is
// outside the bound's assumptions, ARCHITECTURE.md assumption 4).
//
// It has two phases. Until the shift every key is offered 2-4 times its
// limit in every region, for 50 TTLs: a store or node admitting 5 % too
// much passes the bound's TTL term (L.rate·TTL of slack) after some 20
// TTLs of such saturation, and only saturation in every region keeps the
// fleet near L (TestMutantsAreCaught). After it one region asks less
// than its even part, so the coordinators move shares (share.lua runs),
// and the faults strike; over its second half each node is out of its
// region's rotation in turn (Away). Limits and rates are small: the
// package's tests must stay quick under -race.
func randomScenario(seed uint64) Config {
	rng := rand.New(rand.NewPCG(seed, 99))
	c := Default()
	c.Seed = seed
	c.TTL = time.Duration(200+rng.IntN(300)) * time.Millisecond
	c.TargetPeriod = min(c.TTL, time.Duration(100+rng.IntN(400))*time.Millisecond)
	c.Regions = 2 + rng.IntN(3)
	c.Nodes = 1 + rng.IntN(6)
	c.HotNode = rng.IntN(4) == 0
	// Multiples of the regions: a region's policy numbers, until a share
	// is written, are L/n and burst/n rounded down (algorithm.Spec.Share),
	// which would leave part of L unused.
	n := int64(c.Regions)
	c.Limit = n * int64(6+rng.IntN(15))
	c.Burst = n * (c.Limit / n * int64(1+rng.IntN(3)) / 2)
	// Key 0 is leased, the others are decided exactly (check_tb.lua): each
	// of those is offered 2-4 L, which on each node stays under half the
	// rate that makes a key lease (ColdHits per TTL/2), and key 0 over
	// three times that rate.
	nodes := float64(c.Regions * c.Nodes)
	if c.HotNode {
		nodes = float64(c.Regions)
	}
	cold := float64(c.Limit) * (2 + 2*rng.Float64())
	c.ColdHits = min(lease.MaxColdHits, int(math.Ceil(cold/nodes*c.TTL.Seconds()))+1)
	hot := max(3*2*float64(c.ColdHits)/c.TTL.Seconds()*nodes, cold)
	c.Keys = 1 + []int{1, 2, 4}[rng.IntN(3)]
	c.Dist = "hot"
	c.Rate = hot + cold*float64(c.Keys-1)
	c.HotFrac = hot / c.Rate
	c.Interval = time.Duration(1+rng.IntN(4)) * time.Second
	c.Headroom = rng.Float64() * 0.5
	c.RedisRTT = time.Duration(rng.IntN(5000)) * time.Microsecond
	c.RegionLatency = time.Duration(rng.IntN(150)) * time.Millisecond
	c.ShiftAt = max(10*time.Second, 50*c.TTL).Round(time.Second)
	c.Duration = c.ShiftAt + 3*c.Interval + time.Duration(rng.IntN(3))*time.Second
	c.ShiftTo = make([]float64, c.Regions)
	for i := range c.ShiftTo {
		c.ShiftTo[i] = 1 + rng.Float64()
	}
	c.ShiftTo[rng.IntN(c.Regions)] = 0.1 * rng.Float64()
	c.Ramp = time.Duration(rng.IntN(3)) * time.Second
	after := func() time.Duration { return c.ShiftAt + time.Duration(rng.Int64N(int64(c.Duration-c.ShiftAt))) }
	if rng.IntN(3) == 0 {
		c.FlashRegion, c.FlashX = rng.IntN(c.Regions), 2+8*rng.Float64()
		c.FlashAt, c.FlashFor = time.Duration(rng.Int64N(int64(c.Duration))), time.Duration(1+rng.IntN(5))*time.Second
	}
	for range rng.IntN(3) {
		c.Crashes = append(c.Crashes, Crash{Region: rng.IntN(c.Regions), Node: rng.IntN(c.Nodes), At: after()})
	}
	if rng.IntN(4) == 0 {
		c.CoordFailovers = []CoordFailover{{Region: rng.IntN(c.Regions), At: after(), After: time.Duration(rng.IntN(5)) * time.Second}}
	}
	if rng.IntN(2) == 0 {
		from := after()
		c.Partitions = []Partition{{Region: rng.IntN(c.Regions), From: from, To: from + time.Duration(rng.Int64N(int64(10*time.Second)))}}
	}
	addFaults(rng, &c, after)
	// Over the second half of the time after the shift (the shares have
	// moved), each node is out of its region's rotation in turn for
	// 1.25-1.75 TTLs every 2-4 times that: a node that held a grant when
	// its traffic left finds it expired when the traffic comes back (a
	// node spending it breaks the bound's assumption 1:
	// past_ttl_admissions). Drawn last: the other numbers stay as they
	// were.
	c.Away.For = time.Duration((1.25 + 0.5*rng.Float64()) * float64(c.TTL)).Round(time.Millisecond)
	c.Away.Every = time.Duration(2+rng.IntN(3)) * c.Away.For
	c.Away.From = c.ShiftAt + (c.Duration-c.ShiftAt)/2
	return c
}

// addFaults draws the faults of faults.go into c, after every other draw
// (the scenarios' other numbers stay as they were): jitter, message
// loss, clock skew for the whole run; after the shift a one-way or
// single-link partition, a Redis outage decided by a random
// on_store_failure, restarts, a join and a coordinator overlap. Then the
// run goes on for 4 intervals past the last fault's end: faults that
// cost rounds (a coordinator without its lock, reports dropped or cut)
// stall the shares where they were, and the mutants of shares summing
// past L show only once rounds complete again.
func addFaults(rng *rand.Rand, c *Config, after func() time.Duration) {
	ms := func(n int) time.Duration { return time.Duration(rng.IntN(n*1000)) * time.Microsecond }
	end := c.Duration
	window := func(n int) (from, to time.Duration) {
		from = after()
		to = from + ms(n)
		end = max(end, to)
		return from, to
	}
	if rng.IntN(2) == 0 {
		c.Jitter = Jitter{Node: ms(2), Coord: ms(5), Region: ms(100)}
	}
	if rng.IntN(2) == 0 {
		c.Loss = Loss{Drop: 0.05 * rng.Float64(), Dup: 0.05 * rng.Float64(), Reorder: 0.1 * rng.Float64(), Hold: 1 + ms(300)}
	}
	if rng.IntN(2) == 0 {
		c.Skew = Skew{Redis: ms(1000), Node: ms(200), Coord: ms(2000)}
	}
	if rng.IntN(2) == 0 {
		p := Partition{Region: rng.IntN(c.Regions), Dir: Direction(rng.IntN(3))}
		p.From, p.To = window(10000)
		if rng.IntN(2) == 0 {
			p.Link, p.Peer = true, (p.Region+1+rng.IntN(c.Regions-1))%c.Regions
		}
		c.Partitions = append(c.Partitions, p)
	}
	c.OnStoreFailure = []string{FailOpen, FailClosed, FailLocal}[rng.IntN(3)]
	if rng.IntN(2) == 0 {
		o := Outage{Region: rng.IntN(c.Regions)}
		o.From, o.To = window(5000)
		c.Outages = []Outage{o}
	}
	for range rng.IntN(3) {
		r := Restart{Region: rng.IntN(c.Regions), Node: rng.IntN(c.Nodes)}
		r.At, r.Back = window(5000)
		c.Restarts = append(c.Restarts, r)
	}
	if rng.IntN(3) == 0 {
		c.Joins = []Join{{Region: rng.IntN(c.Regions), At: after()}}
	}
	if rng.IntN(4) == 0 {
		o := Overlap{Region: rng.IntN(c.Regions)}
		o.From = after()
		o.To = o.From + time.Duration(1+rng.IntN(3))*c.Interval
		end = max(end, o.To)
		c.Overlaps = []Overlap{o}
	}
	c.Duration = max(c.Duration, end+4*c.Interval).Round(time.Second)
}

// TestPropertyBound drives random scenarios through the fleet: in every
// one, no window of any key admits more than Theorem 2's bound (on the
// admissions it covers: on_store_failure's are counted apart), and no
// key's shares in force ever sum past L (Theorem 1), except while two
// coordinators act in one region at once (an Overlap: outside Theorem
// 1's assumptions, and so Theorem 2's once the shares did sum past L;
// the excess is logged), and no node spends a token of a grant past its
// TTL (the bound's assumption 1). -sim.long runs 200 scenarios
// instead of 40; -sim.first moves the seeds.
func TestPropertyBound(t *testing.T) {
	n := 40
	if *long {
		n = 200
	}
	for seed := range uint64(n) {
		c := randomScenario(seed + uint64(*first))
		t.Run(fmt.Sprint(seed+uint64(*first)), func(t *testing.T) {
			t.Parallel()
			r := run(t, c)
			switch {
			case r.MaxOvershootOverBound > 0 && r.MaxShareSum > 1 && len(c.Overlaps) > 0:
				// Theorem 2 rests on Theorem 1's shares within L, which two
				// coordinators acting at once broke (docs/simulation.md).
				t.Logf("two coordinators in one region: a window %.4f past the bound (%s), outside Theorem 2's assumptions", r.MaxOvershootOverBound, r.WorstWindow)
			case r.MaxOvershootOverBound > 0:
				t.Errorf("overshoot %.4f of the bound (%s) in %+v", r.MaxOvershootOverBound, r.WorstWindow, c)
			}
			if r.PastTTLAdmissions > 0 {
				t.Errorf("%d leased admissions past their grants' TTL in %+v", r.PastTTLAdmissions, c)
			}
			switch {
			case r.MaxShareSum > 1 && len(c.Overlaps) > 0:
				t.Logf("two coordinators in one region: shares summed to %.6f of L (outside Theorem 1), the window bound at %.4f", r.MaxShareSum, r.MaxOvershootOverBound)
			case r.MaxShareSum > 1:
				t.Errorf("shares summed to %.6f of L in %+v", r.MaxShareSum, c)
			}
			if o := c.Overlaps; len(o) > 0 {
				// docs/simulation.md's overlap table is read from this line
				// (internal/tools/simdocs).
				t.Logf("coordinator overlap in region %d %v-%v: max_share_sum %.6f, max_overshoot_over_bound %.6f, worst window %s",
					o[0].Region, o[0].From, o[0].To, r.MaxShareSum, r.MaxOvershootOverBound, r.WorstWindow)
			}
			if len(c.Outages) > 0 && r.StoreFailureDecisions == 0 && r.Offered > 0 {
				t.Logf("the outage decided nothing by on_store_failure")
			}
			if r.Admitted == 0 && r.Offered > 0 {
				t.Errorf("nothing admitted of %d offered", r.Offered)
			}
			if r.KeysChecked != c.Keys || r.KeysAdmitted == 0 && r.Admitted > 0 {
				t.Errorf("bound checked on %d keys of %d, %d admitted", r.KeysChecked, c.Keys, r.KeysAdmitted)
			}
		})
	}
}

// The offered rate follows the profile: a ramp moves linearly, a flash
// crowd multiplies one region's rate for its duration only.
func TestRateProfile(t *testing.T) {
	c := Default()
	c.Rate, c.ShiftAt, c.Ramp, c.ShiftTo = 300, 10*time.Second, 10*time.Second, []float64{1, 0, 0}
	c.FlashRegion, c.FlashAt, c.FlashFor, c.FlashX = 1, 30*time.Second, 5*time.Second, 10
	for _, tc := range []struct {
		at   time.Duration
		want []float64
	}{
		{5 * time.Second, []float64{100, 100, 100}},
		{15 * time.Second, []float64{200, 50, 50}},
		{25 * time.Second, []float64{300, 0, 0}},
		{32 * time.Second, []float64{300, 0, 0}},
	} {
		got := c.rates(tc.at, nil)
		for i := range got {
			if math.Abs(got[i]-tc.want[i]) > 1e-9 {
				t.Errorf("at %v: rates %v, want %v", tc.at, got, tc.want)
			}
		}
	}
	c.ShiftTo = []float64{1, 1, 0}
	if got := c.rates(32*time.Second, nil); math.Abs(got[1]-1500) > 1e-9 {
		t.Errorf("flash crowd: eu at %v, want 10 x 150", got[1])
	}
	if got := c.rates(35*time.Second, nil); math.Abs(got[1]-150) > 1e-9 {
		t.Errorf("after the flash crowd: eu at %v, want 150", got[1])
	}
	if c.lastChange() != 35*time.Second {
		t.Errorf("last change %v, want the flash crowd's end", c.lastChange())
	}
}

// A standby that takes over (coord.Machine's listening epoch, then the
// shares read from Redis) goes on rebalancing: us's coordinator crashes
// after the shift, before any epoch acted on it, and us still grows past
// its default third (without the takeover it stays at 100/s).
func TestCoordinatorFailoverTakesOver(t *testing.T) {
	c := Default()
	c.Duration, c.Rate, c.ShiftAt, c.ShiftTo = 120*time.Second, 1500, 30*time.Second, []float64{0.9, 0.05, 0.05}
	c.CoordFailovers = []CoordFailover{{Region: 0, At: 35 * time.Second, After: 5 * time.Second}}
	r := run(t, c)
	var us int64
	for _, p := range r.PerSecond[90:] {
		us += p.Regions[0]
	}
	if got := float64(us) / 30; got < 120 {
		t.Errorf("us admits %.1f/s after the takeover, want above its default 100/s", got)
	}
	if r.MaxShareSum > 1 || r.MaxOvershootOverBound > 0 {
		t.Errorf("bound broken: %+v", r)
	}
}

// Arrivals are Poisson: mean and variance both the mean, small or large
// (past the 16 at which one product of uniforms is split).
func TestPoissonArrivals(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, mean := range []float64{0.3, 1.35, 40, 1000} {
		const n = 20000
		var sum, sq float64
		for range n {
			x := float64(poisson(rng, mean))
			sum += x
			sq += x * x
		}
		m := sum / n
		v := sq/n - m*m
		// Five standard errors of the mean; the variance within 10 %.
		assert.InDelta(t, mean, m, 5*math.Sqrt(mean/n), "mean of Poisson(%v)", mean)
		assert.InEpsilon(t, mean, v, 0.1, "variance of Poisson(%v)", mean)
	}
	assert.Zero(t, poisson(rng, 0))
}

// The leasing efficiency of lease's TestOvershootBoundAndEfficiency (4
// nodes, 2 keys at 2,000/s burst 200, TTL 500 ms, target period 100 ms,
// offered 10x) on virtual time, where no goroutine stall of a loaded
// machine can waste tokens: the nodes admit at least 99 % of what one
// ideal bucket per key admits of the same arrivals.
func TestLeasedEfficiency(t *testing.T) {
	c := Default()
	c.Regions, c.Nodes, c.Keys, c.Dist = 1, 4, 2, "uniform"
	c.Rate, c.Limit, c.Burst = 20000, 2000, 200
	c.TTL, c.TargetPeriod, c.Duration = 500*time.Millisecond, 100*time.Millisecond, 10*time.Second
	r := run(t, c)
	t.Logf("admitted %d of an ideal %d (%.4f); lease calls %d", r.Admitted, r.Ideal, r.AdmittedOverIdeal, r.LeaseCalls)
	assert.GreaterOrEqual(t, r.AdmittedOverIdeal, 0.99)
	assert.LessOrEqual(t, r.MaxOvershootOverBound, 0.0)
}

// Issue 44's fresh-burst point on virtual time: one node alone on a
// fresh key, offered 30,000/s (far past its rate, as 32 requests in
// flight are on a real node), admits at least 0.97 of an ideal bucket
// over the first 1 s and 3 s of a 100/s key of burst 1,000 and at least
// 0.95 over 5 s of a 1,000/s one (internal/node's TestLeasedFreshBurst
// is the same on a real node and Redis).
func TestLeasedFreshBurst(t *testing.T) {
	for _, tc := range []struct {
		limit int64
		run   time.Duration
		least float64
	}{
		{100, time.Second, 0.97},
		{100, 3 * time.Second, 0.97},
		{1000, 5 * time.Second, 0.95},
	} {
		c := Default()
		c.Regions, c.Nodes, c.Keys, c.Dist = 1, 1, 1, "hot"
		c.Rate, c.Limit, c.Burst, c.Duration = 30000, tc.limit, 1000, tc.run
		r := run(t, c)
		t.Logf("%d/s burst 1,000 over %v: admitted %d of an ideal %d (%.4f); lease calls %d", tc.limit, tc.run, r.Admitted, r.Ideal, r.AdmittedOverIdeal, r.LeaseCalls)
		assert.GreaterOrEqual(t, r.AdmittedOverIdeal, tc.least, "%d/s over %v", tc.limit, tc.run)
	}
}
