package natstest_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/allot-dev/allot/internal/testenv/natstest"
)

func TestCutGatewaysIsolatesOnlyTheGateways(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a supercluster")
	}
	regions := []string{"ap", "eu", "us"}
	sc := natstest.StartSuperclusterProxied(t, regions...)
	conns := map[string]*nats.Conn{}
	subs := map[string]*nats.Subscription{}
	for _, r := range regions {
		nc, err := nats.Connect(sc.URL(r), nats.MaxReconnects(-1))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		sub, err := nc.SubscribeSync("probe")
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		conns[r], subs[r] = nc, sub
	}
	// reaches publishes from `from` every 20 ms until `to` gets one or the
	// deadline passes.
	reaches := func(from, to string) bool {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if err := conns[from].Publish("probe", []byte(from)); err != nil {
				t.Fatal(err)
			}
			for {
				m, err := subs[to].NextMsg(20 * time.Millisecond) // polling
				if err != nil {
					break
				}
				if string(m.Data) == from {
					return true
				}
			}
		}
		return false
	}
	drain := func() {
		for _, s := range subs {
			for {
				if _, err := s.NextMsg(time.Millisecond); err != nil {
					break
				}
			}
		}
	}
	for _, r := range []string{"ap", "us"} {
		if !reaches("eu", r) || !reaches(r, "eu") {
			t.Fatalf("eu and %s do not hear each other before the cut", r)
		}
	}

	sc.CutGateways("eu")
	drain()
	// eu's server and clients stay up: eu hears itself, ap and us each other.
	if !reaches("eu", "eu") || !reaches("ap", "us") || !reaches("us", "ap") {
		t.Fatal("a link other than eu's gateways was cut")
	}
	for range 5 {
		for _, r := range regions {
			if err := conns[r].Publish("probe", []byte(r)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, r := range regions {
		if err := conns[r].Flush(); err != nil {
			t.Fatal(err)
		}
	}
	// Longer than a gateway reconnect (about a second): a reconnect around
	// the proxies would show.
	until := time.Now().Add(2500 * time.Millisecond)
	for time.Now().Before(until) {
		for _, r := range regions {
			m, err := subs[r].NextMsg(10 * time.Millisecond)
			if errors.Is(err, nats.ErrTimeout) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if from := string(m.Data); (from == "eu") != (r == "eu") {
				t.Fatalf("%s got a message from %s across the cut", r, from)
			}
		}
	}

	sc.HealGateways("eu")
	for _, r := range []string{"ap", "us"} {
		if !reaches("eu", r) || !reaches(r, "eu") {
			t.Fatalf("eu and %s do not hear each other after healing", r)
		}
	}
}
