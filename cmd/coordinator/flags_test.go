package main

import (
	"flag"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/cmd/internal/cli"
)

// maxCoordinatorFlags is issue 34's budget for allot-coordinator --help.
const maxCoordinatorFlags = 20

func coordinatorFlags() *flag.FlagSet {
	fs := flag.NewFlagSet("allot-coordinator", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	register(fs)
	return fs
}

// README's "Coordinator flags" table lists exactly the flags --help
// does, with their defaults.
func TestREADMEFlagTableMatchesHelp(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	rows, err := cli.FlagTable(readme, "### Coordinator flags")
	require.NoError(t, err)
	if d := cli.TableDisagreements(coordinatorFlags(), rows, true); len(d) > 0 {
		t.Errorf("README's Coordinator flags table and --help disagree:\n%s", strings.Join(d, "\n"))
	}
}

func TestFlagBudget(t *testing.T) {
	n := 0
	coordinatorFlags().VisitAll(func(*flag.Flag) { n++ })
	assert.LessOrEqual(t, n, maxCoordinatorFlags, "allot-coordinator --help lists %d flags", n)
}

// The rebalance knobs are the policy file's: their old flags fail,
// naming the block.
func TestRebalanceFlagsRemoved(t *testing.T) {
	for _, name := range []string{"interval", "gather", "heavy-hitter", "quota-threshold", "floor", "headroom", "smoothing", "decay", "share-ttl"} {
		err := run([]string{"--store", "memory:", "--" + name + "=1"})
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), "--"+name+" was removed: set rebalance."+strings.ReplaceAll(name, "-", "_")+" in the policy file")
	}
}
