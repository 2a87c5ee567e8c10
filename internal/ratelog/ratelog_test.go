package ratelog_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

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
