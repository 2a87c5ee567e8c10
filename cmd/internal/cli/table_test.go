package cli

import (
	"flag"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const doc = "# T\n\n### Flags\n\nSome text.\n\n" +
	"| flag | default | meaning |\n|---|---|---|\n" +
	"| `--addr` | `127.0.0.1:1` | where |\n" +
	"| `--name` | empty | who |\n" +
	"| `--on` | off | whether |\n" +
	"| `--wait` | `5s` | how long |\n" +
	"\nAfter.\n\n## Other\n\n| flag | meaning |\n|---|---|\n| `--x` | y |\n"

func set() *flag.FlagSet {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.String("addr", "127.0.0.1:1", "")
	fs.String("name", "", "")
	fs.Bool("on", false, "")
	fs.Duration("wait", 5*time.Second, "")
	return fs
}

func TestFlagTableAgrees(t *testing.T) {
	rows, err := FlagTable([]byte(doc), "### Flags")
	require.NoError(t, err)
	require.Len(t, rows, 4)
	assert.Equal(t, TableRow{Name: "addr", Default: "`127.0.0.1:1`"}, rows[0])
	assert.Empty(t, TableDisagreements(set(), rows, true))

	rows, err = FlagTable([]byte(doc), "## Other")
	require.NoError(t, err)
	assert.Equal(t, []TableRow{{Name: "x"}}, rows, "a table without a default column")
}

// Each kind of drift is reported: a flag missing from either side, a
// wrong default, a row of two flags.
func TestFlagTableDisagrees(t *testing.T) {
	rows, err := FlagTable([]byte(doc), "### Flags")
	require.NoError(t, err)
	fs := set()
	fs.Int("extra", 3, "")
	assert.Equal(t, []string{"--extra: in --help, not in the table"}, TableDisagreements(fs, rows, true))

	fs = flag.NewFlagSet("t", flag.ContinueOnError)
	fs.String("addr", "0.0.0.0:1", "")
	fs.String("name", "", "")
	fs.Bool("on", true, "")
	assert.Equal(t, []string{
		"--addr: the table says default \"127.0.0.1:1\", --help \"0.0.0.0:1\"",
		"--on: the table says default \"false\", --help \"true\"",
		"--wait: in the table, not in --help",
	}, TableDisagreements(fs, rows, true))
	assert.Equal(t, []string{"--wait: in the table, not in --help"}, TableDisagreements(fs, rows, false), "names only")

	_, err = FlagTable([]byte("### Flags\n\n| flag | default | meaning |\n|---|---|---|\n| `--a`, `--b` | empty | two |\n"), "### Flags")
	assert.ErrorContains(t, err, "one flag")
	_, err = FlagTable([]byte(doc), "### Missing")
	assert.Error(t, err)
}
