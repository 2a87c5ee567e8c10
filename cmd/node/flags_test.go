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
	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/middleware"
)

// maxNodeFlags is issue 34's budget for allot-node --help.
const maxNodeFlags = 30

func nodeFlags() *flag.FlagSet {
	fs := flag.NewFlagSet("allot-node", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	register(fs)
	return fs
}

// README's "Node flags" table lists exactly the flags --help does, with
// their defaults: neither can change without the other.
func TestREADMEFlagTableMatchesHelp(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	rows, err := cli.FlagTable(readme, "### Node flags")
	require.NoError(t, err)
	if d := cli.TableDisagreements(nodeFlags(), rows, true); len(d) > 0 {
		t.Errorf("README's Node flags table and --help disagree:\n%s", strings.Join(d, "\n"))
	}
}

func TestFlagBudget(t *testing.T) {
	n := 0
	nodeFlags().VisitAll(func(*flag.Flag) { n++ })
	assert.LessOrEqual(t, n, maxNodeFlags, "allot-node --help lists %d flags", n)
}

// A removed flag stops the node before it starts, naming what replaced it.
func TestRemovedFlagRefused(t *testing.T) {
	err := run([]string{"--lease-ttl", "3s", "--store", "/nonexistent"})
	require.Error(t, err)
	assert.Equal(t, "--lease-ttl was removed: set lease.ttl in the policy file (docs/policies.md)", err.Error())
	err = run([]string{"--redis-max-wait", "2s"})
	require.Error(t, err)
	assert.Equal(t, "--redis-max-wait was removed: fixed at 1s (ARCHITECTURE.md, \"Fixed settings\")", err.Error())
}

// The gRPC in-flight bound is a quarter of --max-inflight (today's
// defaults, 2048 and 512); "no bound" and "default" carry over.
func TestGRPCMaxInFlightDerived(t *testing.T) {
	assert.Equal(t, 512, grpcMaxInFlight(2048))
	assert.Equal(t, 16, grpcMaxInFlight(64))
	assert.Equal(t, 1, grpcMaxInFlight(3), "never zero, which would mean the default")
	assert.Equal(t, -1, grpcMaxInFlight(-1))
	assert.Equal(t, 0, grpcMaxInFlight(0))
}

// Profiles are served only on a loopback metrics address.
func TestPprofOnLoopbackOnly(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:9090": true, "localhost:9090": true, "[::1]:9090": true,
		"0.0.0.0:9090": false, ":9090": false, "10.0.0.1:9090": false, "": false,
	} {
		assert.Equal(t, want, node.IsLoopbackAddr(addr), addr)
	}
}

func TestIdentityHeaders(t *testing.T) {
	id, err := parseIdentity("api-key=X-API-Key, user=X-User-ID,tenant=X-Tenant-ID")
	require.NoError(t, err)
	assert.Equal(t, middleware.Identity{APIKeyHeader: "X-API-Key", UserHeader: "X-User-ID", TenantHeader: "X-Tenant-ID"}, id)
	id, err = parseIdentity("")
	require.NoError(t, err)
	assert.Zero(t, id)
	for _, bad := range []string{"X-API-Key", "key=X-API-Key", "tenant=", "user=a,user=b"} {
		_, err := parseIdentity(bad)
		assert.ErrorContains(t, err, "--identity-headers", bad)
	}
}

func TestStoreURL(t *testing.T) {
	assert.Equal(t, "file:p.yaml", storeURL("p.yaml"))
	assert.Equal(t, "file:/etc/allot/p.yaml", storeURL("/etc/allot/p.yaml"))
	for _, u := range []string{"", "file:p.yaml", "nats://127.0.0.1:4222", "postgres://a@b/c", "memory:"} {
		assert.Equal(t, u, storeURL(u))
	}
}
