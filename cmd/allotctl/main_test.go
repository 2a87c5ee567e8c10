package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/admin"
	"github.com/allot-dev/allot/internal/policystore"
)

func ctl(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestCommands(t *testing.T) {
	srv := httptest.NewServer(admin.New(admin.Config{Store: policystore.NewMemory(), Token: "T"}))
	defer srv.Close()
	common := []string{"--server", srv.URL, "--token", "T"}
	with := func(args ...string) []string { return append(append([]string{}, common...), args...) }

	code, out, errOut := ctl(t, with("apply", "-f", "../../examples/policies.yaml")...)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "settings configured (version 1)")
	assert.Contains(t, out, "policy/login configured (version 1)")

	code, out, _ = ctl(t, with("list")...)
	require.Equal(t, 0, code)
	assert.Contains(t, out, "ID")
	assert.Contains(t, out, "login            1        enforce  route=/v1/login")

	code, out, _ = ctl(t, with("get", "login")...)
	require.Equal(t, 0, code)
	assert.Contains(t, out, "id: login\n")
	assert.Contains(t, out, "per: [client]")

	code, out, _ = ctl(t, with("-o", "json", "get", "login")...)
	require.Equal(t, 0, code)
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	assert.Equal(t, "login", got["id"])

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("id: login\nlimits:\n  - {name: m, algorithm: leaky, limit: 0, period: 1m}\n"), 0o600))
	code, _, errOut = ctl(t, with("apply", "-f", bad)...)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, `policy "login": limits[0].algorithm`)
	assert.Contains(t, errOut, `policy "login": limits[0].limit`)
	code, _, errOut = ctl(t, with("validate", "-f", bad, "-o", "json")...)
	assert.Equal(t, 1, code)
	var p admin.Problem
	require.NoError(t, json.Unmarshal([]byte(errOut), &p), errOut)
	assert.Len(t, p.Errors, 2)

	// Valid but a trap: warned about on stderr, exit 0.
	trap := filepath.Join(t.TempDir(), "trap.yaml")
	require.NoError(t, os.WriteFile(trap, []byte("id: perimeter\nper: [ip]\nlimits:\n  - {name: s, algorithm: token_bucket, limit: 200, period: 1s}\n"), 0o600))
	code, _, errOut = ctl(t, with("validate", "-f", trap)...)
	assert.Equal(t, 0, code)
	assert.Contains(t, errOut, `warning: policy "perimeter": per: keys on ip`)

	code, _, errOut = ctl(t, "--server", srv.URL, "delete", "login")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "401")

	code, _, errOut = ctl(t, with("delete", "login", "--version", "7")...)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "409")
	code, out, _ = ctl(t, with("delete", "login", "--version", "1")...)
	require.Equal(t, 0, code)
	assert.Contains(t, out, "policy/login deleted")

	code, out, _ = ctl(t, with("rollback", "login", "1")...)
	require.Equal(t, 0, code, out)
	assert.Contains(t, out, "now version 3")
	code, out, _ = ctl(t, with("history", "login")...)
	require.Equal(t, 0, code)
	assert.Contains(t, out, "deleted")

	code, _, _ = ctl(t, with("frobnicate")...)
	assert.Equal(t, 2, code)
	code, _, _ = ctl(t, with("get")...)
	assert.Equal(t, 2, code)
}
