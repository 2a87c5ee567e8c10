package membership

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func fast(seeds ...string) Config {
	return Config{Seeds: seeds, Floor: 1, ProbeInterval: 100 * time.Millisecond, ProbeTimeout: 50 * time.Millisecond, SuspicionMult: 2}
}

func join(t *testing.T, cfg Config) *Members {
	t.Helper()
	m, err := Join(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { m.Crash() })
	return m
}

func TestNFollowsJoinsLeavesAndFailures(t *testing.T) {
	a := join(t, fast())
	b := join(t, fast(a.Addr()))
	c := join(t, fast(a.Addr()))
	all := []*Members{a, b, c}
	waitN := func(want int, ms ...*Members) {
		t.Helper()
		// Failure detection is bounded; allow it generously for a loaded -race run.
		bound := 5 * fast().FailureDetectionTime(3)
		for _, m := range ms {
			require.Eventually(t, func() bool { return m.N() == want }, bound, 10*time.Millisecond, "N=%d, want %d", m.N(), want)
		}
	}
	waitN(3, all...)

	// A crash (no goodbye) is noticed by failure detection.
	require.NoError(t, c.Crash())
	start := time.Now()
	waitN(2, a, b)
	t.Logf("crash noticed after %v (documented bound %v)", time.Since(start), fast().FailureDetectionTime(3))

	// A graceful leave is noticed at once.
	require.NoError(t, b.Leave(time.Second))
	waitN(1, a)
}

func TestFloorHoldsWhenAlone(t *testing.T) {
	cfg := fast("127.0.0.1:1") // nobody there
	cfg.Floor = 3
	m := join(t, cfg)
	assert.Equal(t, 1, m.Live())
	assert.Equal(t, 3, m.N(), "alone, a node assumes the floor, never N=1")
}

func TestFailureDetectionTimeScalesWithConfig(t *testing.T) {
	c := Config{ProbeInterval: time.Second, ProbeTimeout: 500 * time.Millisecond, SuspicionMult: 4, SuspicionMaxTimeoutMult: 2}
	assert.Equal(t, 9500*time.Millisecond, c.FailureDetectionTime(3))
	assert.Equal(t, 17500*time.Millisecond, c.FailureDetectionTime(100))
	assert.Equal(t, 4750*time.Millisecond, Config{}.FailureDetectionTime(3), "defaults")
}
