package main

import (
	"io"
	"log/slog"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The node's GC target applies unless GOGC is set in the environment.
func TestGCPercent(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	orig := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(orig) })

	t.Setenv("GOGC", "")
	setGCPercent(log)
	assert.Equal(t, defaultGCPercent, debug.SetGCPercent(100), "no GOGC: the node's target")

	t.Setenv("GOGC", "150")
	setGCPercent(log)
	assert.Equal(t, 100, debug.SetGCPercent(100), "GOGC set: left to the runtime")
}
