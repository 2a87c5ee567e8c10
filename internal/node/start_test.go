package node_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/node"
)

func TestBadPolicyFileFailsStartNamingFilePolicyAndField(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`
policies:
  - id: free-tier
    limits:
      - {name: per_second, algorithm: token_bucket, limit: -5, period: 1s}
`), 0o600))
	_, err := node.Start(context.Background(), node.Config{GRPCAddr: "127.0.0.1:0", PoliciesPath: path})
	require.Error(t, err)
	for _, want := range []string{path, `policy "free-tier"`, "limits[0].limit"} {
		assert.Contains(t, err.Error(), want)
	}
}
