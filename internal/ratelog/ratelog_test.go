package ratelog_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/ratelog"
	"github.com/allot-dev/allot/internal/testenv/fakeclock"
)

func TestOneLinePerIntervalWithTheSuppressedCount(t *testing.T) {
	var buf bytes.Buffer
	clk := fakeclock.New(time.Unix(0, 0))
	log := ratelog.New(slog.New(slog.NewTextHandler(&buf, nil)), 10*time.Second, clk.Now)
	for range 100 {
		log.Warn("lease refill failed", "keys", 3)
	}
	log.Warn("other line") // another message has its own limit
	clk.Advance(10 * time.Second)
	log.With("k", "v").Warn("lease refill failed") // derived loggers share the limit
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if !assert.Len(t, lines, 3, buf.String()) {
		return
	}
	assert.NotContains(t, lines[0], "suppressed")
	assert.Contains(t, lines[1], "other line")
	assert.Contains(t, lines[2], "suppressed=99")
}

// Formatted messages (a key each) never grow the limits past their bound:
// one that finds no room passes unlimited, and room comes back once the
// oldest have been idle for an interval.
func TestDistinctMessagesAreBounded(t *testing.T) {
	var buf bytes.Buffer
	clk := fakeclock.New(time.Unix(0, 0))
	log := ratelog.New(slog.New(slog.NewTextHandler(&buf, nil)), 10*time.Second, clk.Now)
	const bound = 1024 // ratelog's maxKeys
	for i := range 3 * bound {
		log.Warn(fmt.Sprintf("shard %d down", i))
	}
	assert.Equal(t, 3*bound, strings.Count(buf.String(), "\n"), "every distinct message passes")
	assert.Equal(t, bound, ratelog.Tracked(log), "the map stops at its bound")
	// The untracked ones are not limited; the tracked ones are.
	buf.Reset()
	log.Warn(fmt.Sprintf("shard %d down", 2*bound))
	log.Warn(fmt.Sprintf("shard %d down", 2*bound))
	log.Warn("shard 0 down")
	assert.Equal(t, 2, strings.Count(buf.String(), "\n"))
	// An interval later the idle entries make room again.
	clk.Advance(10 * time.Second)
	buf.Reset()
	log.Warn("a new line")
	log.Warn("a new line")
	assert.Equal(t, 1, strings.Count(buf.String(), "\n"))
	assert.LessOrEqual(t, ratelog.Tracked(log), bound)
}

// A standard logger's formatted lines are limited as one message.
func TestStdLoggerLimitsFormattedLines(t *testing.T) {
	var buf bytes.Buffer
	clk := fakeclock.New(time.Unix(0, 0))
	std := ratelog.StdLogger(ratelog.New(slog.New(slog.NewTextHandler(&buf, nil)), 10*time.Second, clk.Now), "http server error")
	for i := range 50 {
		std.Printf("http: TLS handshake error from 192.0.2.1:%d: EOF", 40000+i)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 1)
	assert.Contains(t, lines[0], `msg="http server error"`)
	assert.Contains(t, lines[0], `err="http: TLS handshake error from 192.0.2.1:40000: EOF"`)
	assert.Contains(t, lines[0], "level=WARN")
}
