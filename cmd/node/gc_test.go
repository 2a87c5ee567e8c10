package main

import (
	"flag"
	"io"
	"log/slog"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// intFlag parses args with one int flag name (default def) defined, as
// the node's flag set would.
func intFlag(t *testing.T, name string, def int, args ...string) (*flag.FlagSet, int) {
	t.Helper()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	v := fs.Int(name, def, "")
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return fs, *v
}

// --gc-percent sets the GC target; GOGC from the environment is kept when
// the flag is not given, and overridden when it is.
func TestGCPercent(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	orig := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(orig) })
	parse := func(args ...string) (*flag.FlagSet, int) { return intFlag(t, "gc-percent", defaultGCPercent, args...) }

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

// --gomaxprocs sets GOMAXPROCS; the environment's is kept when the flag is
// not given, and 0 leaves Go's default.
func TestMaxProcs(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	orig := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(orig) })
	parse := func(args ...string) (*flag.FlagSet, int) { return intFlag(t, "gomaxprocs", 0, args...) }

	runtime.GOMAXPROCS(3)
	t.Setenv("GOMAXPROCS", "")
	fs, n := parse()
	setMaxProcs(fs, n, log)
	assert.Equal(t, 3, runtime.GOMAXPROCS(0), "no flag: left alone")

	fs, n = parse("--gomaxprocs", "1")
	setMaxProcs(fs, n, log)
	assert.Equal(t, 1, runtime.GOMAXPROCS(0), "the flag applies")

	runtime.GOMAXPROCS(3)
	t.Setenv("GOMAXPROCS", "2")
	fs, n = parse("--gomaxprocs", "1")
	setMaxProcs(fs, n, log)
	assert.Equal(t, 1, runtime.GOMAXPROCS(0), "the flag wins over GOMAXPROCS")

	runtime.GOMAXPROCS(3)
	fs, n = parse("--gomaxprocs", "0")
	setMaxProcs(fs, n, log)
	assert.Equal(t, 3, runtime.GOMAXPROCS(0), "0 leaves Go's default")
}

// A negative --gomaxprocs is refused before the node starts.
func TestNegativeMaxProcsRefused(t *testing.T) {
	err := run([]string{"--gomaxprocs", "-1", "--policies", "/nonexistent"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--gomaxprocs -1")
}

// --lease-cold-hits outside 1-255 is refused before the node starts (the
// count lives in 8 bits of a key's entry; 0 would lease every key at once).
func TestLeaseColdHitsRange(t *testing.T) {
	for _, v := range []string{"0", "-3", "256"} {
		err := run([]string{"--lease-cold-hits", v, "--policies", "/nonexistent"})
		require.Error(t, err, v)
		assert.Contains(t, err.Error(), "--lease-cold-hits "+v+": want 1 to 255")
	}
}
