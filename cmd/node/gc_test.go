package main

import (
	"flag"
	"io"
	"log/slog"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
)

// --gc-percent sets the GC target; GOGC from the environment is kept when
// the flag is not given, and overridden when it is.
func TestGCPercent(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	orig := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(orig) })
	parse := func(args ...string) (*flag.FlagSet, int) {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		p := fs.Int("gc-percent", defaultGCPercent, "")
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return fs, *p
	}

	t.Setenv("GOGC", "")
	fs, p := parse()
	setGCPercent(fs, p, log)
	assert.Equal(t, defaultGCPercent, debug.SetGCPercent(100), "no GOGC: the default applies")

	t.Setenv("GOGC", "150")
	fs, p = parse()
	setGCPercent(fs, p, log)
	assert.Equal(t, 100, debug.SetGCPercent(100), "GOGC set and no flag: left alone")

	fs, p = parse("--gc-percent", "250")
	setGCPercent(fs, p, log)
	assert.Equal(t, 250, debug.SetGCPercent(100), "the flag wins over GOGC")

	fs, p = parse("--gc-percent", "0")
	setGCPercent(fs, p, log)
	assert.Equal(t, 100, debug.SetGCPercent(100), "0 leaves Go's default")
}
