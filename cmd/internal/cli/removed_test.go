package cli

import (
	"flag"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newSet() *flag.FlagSet {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.String("store", "", "")
	fs.Bool("verbose", false, "")
	fs.String("admin-addr", "", "") // removed from allot-node, kept here
	return fs
}

// A removed flag fails with one line naming its replacement, on the
// command line in every spelling and from its ALLOT_ variable.
func TestRemovedFlagNamesItsReplacement(t *testing.T) {
	for _, args := range [][]string{
		{"--lease-ttl", "2s"},
		{"-lease-ttl=2s"},
		{"--store", "p.yaml", "--lease-ttl=2s"},
		{"--verbose", "--lease-ttl", "2s"},
	} {
		err := Parse(newSet(), args)
		require.Error(t, err, args)
		assert.Equal(t, "--lease-ttl was removed: set lease.ttl in the policy file (docs/policies.md)", err.Error(), args)
	}
	t.Setenv("ALLOT_INTERVAL", "10s")
	err := Parse(newSet(), nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ALLOT_INTERVAL (--interval) was removed: set rebalance.interval in the policy file")
}

// A flag the command still defines is never refused, nor a removed
// name that is only a flag's value or follows the end of the flags.
func TestRemovedTableLeavesDefinedFlagsAlone(t *testing.T) {
	require.NoError(t, Parse(newSet(), []string{"--admin-addr", "127.0.0.1:1"}))
	require.NoError(t, Parse(newSet(), []string{"--store", "--lease-ttl"}), "a value")
	require.NoError(t, Parse(newSet(), []string{"--", "--lease-ttl"}), "after --")
	t.Setenv("ALLOT_ADMIN_ADDR", "127.0.0.1:1")
	require.NoError(t, Parse(newSet(), nil))
	err := Parse(newSet(), []string{"--no-such-flag"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "flag provided but not defined", "not in the table: package flag's error")
}

// Every entry of the table says what to do instead.
func TestRemovedEntriesSaySomething(t *testing.T) {
	for name, r := range removed {
		assert.NotEmpty(t, r, name)
		assert.NotContains(t, name, "-"+"-", name)
	}
}
