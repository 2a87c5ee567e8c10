package cli

import (
	"bytes"
	"flag"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseAndLogLevel(t *testing.T) {
	t.Setenv("ALLOT_NAME", "from-env")
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	name := fs.String("name", "", "")
	var out bytes.Buffer
	logger := LogLevel(fs, "info", &out)
	require.NoError(t, Parse(fs, []string{"--log-level", "warn"}))
	assert.Equal(t, "from-env", *name)
	log, err := logger()
	require.NoError(t, err)
	log.Info("hidden")
	log.Warn("shown")
	assert.NotContains(t, out.String(), "hidden")
	assert.Contains(t, out.String(), "shown")

	fs = flag.NewFlagSet("t", flag.ContinueOnError)
	logger = LogLevel(fs, "info", &out)
	require.NoError(t, Parse(fs, []string{"--log-level", "loud"}))
	_, err = logger()
	assert.ErrorContains(t, err, "--log-level")
}

func TestList(t *testing.T) {
	assert.Equal(t, []string{"a", "b c", "d"}, List(" a, b c,,d ,"))
	assert.Empty(t, List(" , "))
}
