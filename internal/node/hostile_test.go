//go:build hostile

package node_test

// Hostile-input measurements (docs/performance.md, "Hostile input"): a
// node binary in its own process, so its RSS is its own, under floods a
// hostile caller can send cheaply. Not a unit test: run by hand, under the
// CPU lock:
//
//	flock /tmp/allot-cpu.lock go test -tags hostile ./node -run Hostile -v -count=1
//
// ALLOT_NODE_BIN picks the binary (e.g. one built from an older commit);
// by default ./cmd/node is built. ALLOT_NODE_ARGS adds flags.

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot/internal/node/nodetest"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

func nodeBinary(t *testing.T) string {
	if b := os.Getenv("ALLOT_NODE_BIN"); b != "" {
		return b
	}
	bin := filepath.Join(t.TempDir(), "allot-node")
	out, err := exec.Command("go", "build", "-o", bin, "../../cmd/node").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

func startBinary(t *testing.T) (*exec.Cmd, string) {
	addr := freePort(t)
	args := []string{"--grpc-addr", addr, "--http-addr", "", "--store", nodetest.PolicyFile(t, testPolicies)}
	if extra := os.Getenv("ALLOT_NODE_ARGS"); extra != "" {
		args = append(args, strings.Fields(extra)...) // e.g. "--max-inflight 256"
	}
	cmd := exec.Command(nodeBinary(t), args...)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for range 100 {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return cmd, addr
		}
		time.Sleep(50 * time.Millisecond) // polling a process we do not own the readiness of
	}
	t.Fatal("node did not listen")
	return nil, ""
}

// rss reads VmRSS and VmHWM (peak) of pid, in MB.
func rss(t *testing.T, pid int) (cur, peak float64) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for line := range strings.SplitSeq(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmRSS:":
			cur = kb / 1024
		case "VmHWM:":
			peak = kb / 1024
		}
	}
	return cur, peak
}

// 200 concurrent checks of ~4 MB (a 4,000,000-byte route: invalid, and
// under grpc-go's 4 MiB default), on 10 connections.
func TestHostileOversizedFlood(t *testing.T) { flood(t, 4_000_000) }

// The same with messages just under the receive limit: what a flood that
// gets past the size check costs.
func TestHostileUnderLimitFlood(t *testing.T) { flood(t, 3_100_000) }

func flood(t *testing.T, size int) {
	cmd, addr := startBinary(t)
	before, _ := rss(t, cmd.Process.Pid)
	req := &ratelimitv1.RateLimitRequest{TenantId: "t", Route: strings.Repeat("x", size)}
	var conns []ratelimitv1.RateLimiterServiceClient
	for range 10 {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
		require.NoError(t, err)
		defer conn.Close()
		conns = append(conns, ratelimitv1.NewRateLimiterServiceClient(conn))
	}
	codes := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for i := range 200 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err := conns[i%len(conns)].CheckRateLimit(ctx, req)
			mu.Lock()
			codes[status.Code(err).String()]++
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	after, peak := rss(t, cmd.Process.Pid)
	t.Logf("200 x %d-byte checks in %v: %v; node RSS before %.0f MB, peak %.0f MB, after %.0f MB", size, elapsed.Round(time.Millisecond), codes, before, peak, after)
}

func TestHostileSilentConnections(t *testing.T) {
	_, addr := startBinary(t)
	const n = 500
	lifetimes := make([]time.Duration, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				lifetimes[i] = -1
				return
			}
			defer c.Close()
			_ = c.SetReadDeadline(time.Now().Add(3 * time.Minute))
			buf := make([]byte, 1)
			for {
				if _, err := c.Read(buf); err != nil {
					break
				}
			}
			lifetimes[i] = time.Since(start)
		})
	}
	wg.Wait()
	var lo, hi time.Duration = time.Hour, 0
	for _, l := range lifetimes {
		lo, hi = min(lo, l), max(hi, l)
	}
	t.Logf("%d connections that never speak: closed by the node after %v to %v", n, lo.Round(time.Millisecond), hi.Round(time.Millisecond))
}
