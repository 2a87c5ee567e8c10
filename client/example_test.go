package client_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/allot-dev/allot/client"
	"github.com/allot-dev/allot/internal/node"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// A service asks its nodes before doing work. The node here runs in
// process for the example; in production pass the nodes' addresses, and
// client.WithTLS for TLS or mTLS.
func Example() {
	dir, _ := os.MkdirTemp("", "allot-example")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "policies.yaml")
	_ = os.WriteFile(path, []byte(`
policies:
  - id: per-user
    match: {}
    per: [client]
    limits:
      - {name: per_minute, algorithm: token_bucket, limit: 2, period: 1m}
`), 0o600)
	n, err := node.Start(context.Background(), node.Config{GRPCAddr: "127.0.0.1:0", PoliciesPath: path})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer n.Close(5 * time.Second)

	c, err := client.New([]string{n.Addr()}) // several addresses: round-robin
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The fourth answer comes from the deny cache, without an RPC.
	for range 4 {
		// FailOpen: if no node answers, go on (FAILED_OPEN, client.Local).
		resp, err := c.Check(ctx, &ratelimitv1.RateLimitRequest{ClientIdentifier: "usr_1", Route: "/v1/orders"}, client.OnUnreachable(client.FailOpen))
		if err != nil {
			fmt.Println("bad request:", err)
			return
		}
		fmt.Println(resp.Decision, resp.RetryAfterMs > 0)
	}
	// Output:
	// ALLOWED false
	// ALLOWED false
	// THROTTLED true
	// THROTTLED true
}
