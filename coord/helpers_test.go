package coord

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/rebalance"
)

// ledger is the shares in force in every region, shared by the regions'
// fake writers so that every single write can be checked against the
// global invariant: Σ over regions of a key's shares <= Unit.
type ledger struct {
	t       testing.TB
	mu      sync.Mutex
	def     rebalance.Share
	shares  map[string]map[string]rebalance.Share // region -> key -> share
	history map[string][]rebalance.Share          // region+"|"+key -> every share written
	fail    map[string]bool                       // regions whose writes fail
}

func newLedger(t testing.TB, regions []string) *ledger {
	l := &ledger{t: t, def: rebalance.Default(len(regions)), shares: map[string]map[string]rebalance.Share{}, history: map[string][]rebalance.Share{}, fail: map[string]bool{}}
	for _, r := range regions {
		l.shares[r] = map[string]rebalance.Share{}
	}
	return l
}

func (l *ledger) share(region, key string) rebalance.Share {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.shareLocked(region, key)
}

func (l *ledger) shareLocked(region, key string) rebalance.Share {
	if s, ok := l.shares[region][key]; ok {
		return s
	}
	return l.def
}

func (l *ledger) writer(region string) ShareWriter { return ledgerWriter{l, region} }

type ledgerWriter struct {
	l      *ledger
	region string
}

func (w ledgerWriter) WriteShares(_ context.Context, us []ShareUpdate) error {
	l := w.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fail[w.region] {
		return fmt.Errorf("%s: injected write failure", w.region)
	}
	for _, u := range us {
		l.shares[w.region][u.Key] = u.Share
		l.history[w.region+"|"+u.Key] = append(l.history[w.region+"|"+u.Key], u.Share)
		var sum int64
		for r := range l.shares {
			sum += int64(l.shareLocked(r, u.Key))
		}
		if sum > int64(rebalance.Unit) {
			l.t.Errorf("after %s wrote %s=%d the shares in force sum to %d > %d", w.region, u.Key, u.Share, sum, rebalance.Unit)
		}
	}
	return nil
}

func (w ledgerWriter) ReadShares(_ context.Context, keys []string, _ Limits) (map[string]rebalance.Share, error) {
	w.l.mu.Lock()
	defer w.l.mu.Unlock()
	out := map[string]rebalance.Share{}
	for _, k := range keys {
		if s, ok := w.l.shares[w.region][k]; ok {
			out[k] = s
		}
	}
	return out, nil
}

// rateDemand is a DemandSource whose keys see constant rates (tokens/s),
// integrated over real time, so a rate change mid-interval counts right.
type rateDemand struct {
	mu    sync.Mutex
	rates map[string]float64
	acc   map[string]float64
	since time.Time
}

var _ DemandSource = (*rateDemand)(nil)

func newRateDemand() *rateDemand {
	return &rateDemand{rates: map[string]float64{}, acc: map[string]float64{}, since: time.Now()}
}

func (d *rateDemand) integrateLocked() {
	now := time.Now()
	secs := now.Sub(d.since).Seconds()
	d.since = now
	for k, r := range d.rates {
		d.acc[k] += r * secs
	}
}

func (d *rateDemand) set(key string, rate float64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.integrateLocked()
	d.rates[key] = rate
}

// Drain reports whole tokens and keeps the fractions for the next drain,
// as a real counter would: at 20/s a 100 ms interval holds 2 tokens, and
// dropping fractions would make a key vanish below the heavy-hitter
// threshold now and then.
func (d *rateDemand) Drain(fn func(key string, admitted, denied int64)) {
	d.mu.Lock()
	d.integrateLocked()
	whole := map[string]int64{}
	for k, v := range d.acc {
		whole[k] = int64(v)
		d.acc[k] = v - float64(whole[k])
	}
	d.mu.Unlock()
	for k, v := range whole {
		fn(k, v, 0)
	}
}

// eventually polls cond every few milliseconds until it holds or timeout
// passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for: %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
	}
}

// testLogger logs into the test's output, shown only when it fails.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
}
