package envflag

import (
	"flag"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEnvFillsUnsetFlagsAndCommandLineWins(t *testing.T) {
	t.Setenv("ALLOT_GRPC_ADDR", "127.0.0.1:9")
	t.Setenv("ALLOT_REDIS", "from-env")
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	addr := fs.String("grpc-addr", "default", "")
	redis := fs.String("redis", "", "")
	other := fs.String("other", "keep", "")
	require.NoError(t, fs.Parse([]string{"--redis", "from-flag"}))
	require.NoError(t, Apply(fs, "ALLOT_"))
	assert.Equal(t, "127.0.0.1:9", *addr)
	assert.Equal(t, "from-flag", *redis)
	assert.Equal(t, "keep", *other)
}

func TestBadEnvValueNamesTheVariable(t *testing.T) {
	t.Setenv("ALLOT_TIMEOUT", "soon")
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.Duration("timeout", 0, "")
	require.NoError(t, fs.Parse(nil))
	err := Apply(fs, "ALLOT_")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ALLOT_TIMEOUT")
}
