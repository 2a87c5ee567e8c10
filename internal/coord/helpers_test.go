package coord

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"

	"github.com/allot-dev/allot/rebalance"
)

// globalLedger is the shares in force in every region, shared by the regions'
// fake writers so that every single write can be checked against the
// global invariant: Σ over regions of a key's shares <= Unit.
type globalLedger struct {
	t      testing.TB
	mu     sync.Mutex
	def    rebalance.Share
	shares map[string]map[string]rebalance.Share // region -> key -> share
	fail   map[string]bool                       // regions whose writes fail
	// violations lists every write that broke the invariant; with t set
	// each also fails the test.
	violations []string
}

func newLedger(t testing.TB, regions []string) *globalLedger {
	l := &globalLedger{t: t, def: rebalance.Default(len(regions)), shares: map[string]map[string]rebalance.Share{}, fail: map[string]bool{}}
	for _, r := range regions {
		l.shares[r] = map[string]rebalance.Share{}
	}
	return l
}

func (l *globalLedger) shareLocked(region, key string) rebalance.Share {
	if s, ok := l.shares[region][key]; ok {
		return s
	}
	return l.def
}

func (l *globalLedger) writer(region string) ShareWriter { return ledgerWriter{l, region} }

type ledgerWriter struct {
	l      *globalLedger
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
		var sum int64
		for r := range l.shares {
			sum += int64(l.shareLocked(r, u.Key))
		}
		if sum > int64(rebalance.Unit) {
			v := fmt.Sprintf("after %s wrote %s=%d the shares in force sum to %d > %d", w.region, u.Key, u.Share, sum, rebalance.Unit)
			l.violations = append(l.violations, v)
			if l.t != nil {
				l.t.Errorf("%s", v)
			}
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

// testLogger logs into the test's output, shown only when it fails.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
}
