// Package nodetest starts in-process nodes for tests, as net/http/httptest
// starts servers: a node.Node listening on a free port of 127.0.0.1,
// enforcing a policy file's text, closed when the test ends, and gRPC
// connections to it.
//
// It lives beside the node rather than in internal/testenv, whose
// harnesses stand beside the product (Redis and NATS processes, a faulty
// network, certificates, clocks) and import almost nothing of it: only
// luatest imports a product package, lua, to lay out script arguments
// through the same lua.AppendCheckTB the product uses, and lua imports
// nothing of the product. A harness that runs a whole node belongs with
// the node. No product package imports it.
package nodetest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/allot-dev/allot/internal/node"
)

// closeTimeout bounds a node's close at the end of a test.
const closeTimeout = 5 * time.Second

// PolicyFile writes policies (a policy file's YAML or JSON) to a file of
// the test's own and returns its path.
func PolicyFile(t testing.TB, policies string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policies.yaml")
	if err := os.WriteFile(path, []byte(policies), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Start starts a node enforcing the policy file text policies ("": no
// policies, every request allowed), configured otherwise by cfg; an
// empty cfg.GRPCAddr listens on a free port of 127.0.0.1. The node is
// closed when the test ends. Start returns it with a connection to its
// gRPC address (Dial).
func Start(t testing.TB, policies string, cfg node.Config) (*node.Node, *grpc.ClientConn) {
	t.Helper()
	if policies != "" {
		cfg.PoliciesPath = PolicyFile(t, policies)
	}
	if cfg.GRPCAddr == "" {
		cfg.GRPCAddr = "127.0.0.1:0"
	}
	n, err := node.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(closeTimeout); err != nil {
			t.Error(err)
		}
	})
	return n, Dial(t, n)
}

// Dial returns a new plaintext gRPC connection to n, closed when the
// test ends. It connects on first use.
func Dial(t testing.TB, n *node.Node) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
