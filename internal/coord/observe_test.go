package coord

import (
	"context"
	"sync"
	"testing"
	"time"
)

// The driver runs the machine with real timers on the in-memory hub, and
// Observe sees every active epoch, with its timing, stats and this
// region's non-default shares (without keys).
func TestObserveSeesActiveEpochs(t *testing.T) {
	regions := []string{"eu", "us"}
	hub, globalLedger := NewHub(), newLedger(t, regions)
	rounds := make(chan Round, 64)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, r := range regions {
		tokens := map[string]int64{"eu": 9, "us": 1}[r]
		d := demandFunc(func(fn func(string, int64, int64)) { fn(testKey, tokens, 0) })
		cfg := Config{Region: r, Regions: regions, Transport: hub.Join(r), Demand: d,
			Writer: globalLedger.writer(r), Limits: testLimits, Knobs: testKnobs(), Logger: testLogger(t)}
		if r == "eu" {
			cfg.Observe = func(_ context.Context, rd Round) {
				select {
				case rounds <- rd:
				default: // the test has seen enough
				}
			}
		}
		co, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { _ = co.Run(ctx) })
	}
	timeout := time.After(20 * time.Second)
	for {
		select {
		case rd := <-rounds:
			if rd.Regions != 2 || !rd.End.After(rd.Start) || rd.Stats.Epoch == 0 {
				t.Fatalf("bad round %+v", rd)
			}
			if len(rd.Shares) > 0 && rd.Stats.Heard == 2 {
				return
			}
		case <-timeout:
			t.Fatal("no observed epoch with a non-default share")
		}
	}
}

// demandFunc is a DemandSource from a function.
type demandFunc func(fn func(string, int64, int64))

func (f demandFunc) Drain(fn func(string, int64, int64)) { f(fn) }
