package main

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/admin"
	"github.com/allot-dev/allot/internal/policystore"
	"github.com/allot-dev/allot/policy"
)

// apply -f of a file with only runtime blocks writes them as settings;
// no dedicated command is needed.
func TestApplyWritesRuntimeSettings(t *testing.T) {
	store := policystore.NewMemory()
	srv := httptest.NewServer(admin.New(admin.Config{Store: store, Token: "T"}))
	defer srv.Close()
	path := filepath.Join(t.TempDir(), "settings.yaml")
	require.NoError(t, os.WriteFile(path, []byte("rebalance: {decay: 0.5, interval: 5s}\nlease: {ttl: 3s}\n"), 0o600))

	code, out, errOut := ctl(t, "--server", srv.URL, "--token", "T", "apply", "-f", path)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "settings configured (version 1)")
	st, err := store.Settings(context.Background())
	require.NoError(t, err)
	require.NotNil(t, st.Rebalance)
	assert.Equal(t, 0.5, *st.Rebalance.Decay)
	assert.Equal(t, policy.Duration(5*time.Second), st.Rebalance.Interval)
	assert.Equal(t, &policy.LeaseKnobs{TTL: policy.Duration(3 * time.Second)}, st.Lease)

	require.NoError(t, os.WriteFile(path, []byte("rebalance: {decay: 5}\n"), 0o600))
	code, _, errOut = ctl(t, "--server", srv.URL, "--token", "T", "apply", "-f", path)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "rebalance.decay")
}
