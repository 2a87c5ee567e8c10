// Package redistest starts real redis-server processes for tests: a single
// server (Server) or a small Redis Cluster (Cluster). Every process is
// bound to 127.0.0.1, keeps no data on disk beyond t.TempDir(), and is
// killed when the test ends.
package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startTimeout bounds how long a freshly started server may take to answer
// PING, and how long a new cluster may take to report cluster_state:ok.
const startTimeout = 15 * time.Second

// startAttempts is how often a start is retried when the free port we
// picked was taken by someone else before redis-server could bind it.
const startAttempts = 5

// pollInterval is the pause between readiness probes.
const pollInterval = 20 * time.Millisecond

// Require skips the test when redis-server is not on PATH, or fails it
// when ALLOT_REQUIRE_REDIS=1 (CI must not silently skip Redis tests).
func Require(t testing.TB) {
	t.Helper()
	requireBinary(t, "redis-server")
}

func requireBinary(t testing.TB, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err == nil {
		return
	}
	msg := name + " not found on PATH; install it (apt-get install redis-server) or run make test"
	if os.Getenv("ALLOT_REQUIRE_REDIS") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// Instance is one redis-server process owned by a test.
type Instance struct {
	// Addr is host:port, stable across Restart.
	Addr string

	t     testing.TB
	dir   string
	extra []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
}

// Server starts a standalone redis-server on a free port and returns once
// it answers PING. It is killed when the test ends.
func Server(t testing.TB) *Instance {
	t.Helper()
	Require(t)
	return start(t, t.TempDir())
}

func start(t testing.TB, dir string, extra ...string) *Instance {
	t.Helper()
	var lastErr error
	for range startAttempts {
		port, err := freePort()
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		in := &Instance{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), t: t, dir: dir, extra: extra}
		if lastErr = in.launch(); lastErr == nil {
			t.Cleanup(in.Kill)
			return in
		}
	}
	t.Fatalf("redistest: start redis-server: %v", lastErr)
	return nil
}

// freePort asks the kernel for an unused port. Another process may grab it
// before redis-server binds it; start retries with a new port if so.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// launch starts the process and waits for PING. On failure the process is
// gone and the error carries the tail of its log.
func (in *Instance) launch() error {
	_, port, _ := net.SplitHostPort(in.Addr)
	args := append([]string{
		"--port", port,
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", in.dir,
	}, in.extra...)
	logf, err := os.OpenFile(filepath.Join(in.dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	cmd := exec.Command("redis-server", args...)
	cmd.Dir = in.dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("exec redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	in.mu.Lock()
	in.cmd, in.done = cmd, done
	in.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := waitReady(ctx, in.Addr, done); err != nil {
		in.Kill()
		return fmt.Errorf("%s: %w\n%s", in.Addr, err, in.logTail())
	}
	return nil
}

// waitReady polls PING until it answers, the process exits or ctx ends.
func waitReady(ctx context.Context, addr string, exited <-chan struct{}) error {
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 200 * time.Millisecond, MaxRetries: -1, Protocol: 2})
	defer c.Close()
	for {
		err := c.Ping(ctx).Err()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return errors.New("redis-server exited before answering PING")
		case <-ctx.Done():
			return fmt.Errorf("no PING answer: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(pollInterval):
		}
	}
}

func (in *Instance) logTail() string {
	b, _ := os.ReadFile(filepath.Join(in.dir, "redis.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(bytes.TrimSpace(b))
}

func (in *Instance) signal(sig syscall.Signal) {
	in.t.Helper()
	in.mu.Lock()
	cmd, done := in.cmd, in.done
	in.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return // already exited
	default:
	}
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		in.t.Errorf("redistest: signal %v to %s: %v", sig, in.Addr, err)
	}
}

// Kill sends SIGKILL and waits for the process to exit. Safe to call twice.
func (in *Instance) Kill() {
	in.signal(syscall.SIGKILL)
	in.mu.Lock()
	done := in.done
	in.mu.Unlock()
	if done != nil {
		<-done
	}
}

// Pause freezes the server with SIGSTOP: connections stay open but nothing
// is answered, like a stalled or partitioned node.
func (in *Instance) Pause() { in.signal(syscall.SIGSTOP) }

// Continue resumes a paused server with SIGCONT.
func (in *Instance) Continue() { in.signal(syscall.SIGCONT) }

// Restart kills the server if it runs and starts it again on the same port
// and directory (a cluster node keeps its nodes.conf, so it rejoins).
// Data is lost: persistence is off.
func (in *Instance) Restart() {
	in.t.Helper()
	in.Kill()
	var err error
	for range startAttempts {
		// The old socket can linger briefly; redis-server sets SO_REUSEADDR,
		// but another process may have taken the port meanwhile.
		if err = in.launch(); err == nil {
			return
		}
	}
	in.t.Fatalf("redistest: restart %s: %v", in.Addr, err)
}

// Cluster starts masters redis-server processes in cluster mode, joins them
// with `redis-cli --cluster create` (no replicas) and returns their
// addresses once every node reports cluster_state:ok. Redis needs at least
// 3 masters.
func Cluster(t testing.TB, masters int) []string {
	t.Helper()
	Require(t)
	requireBinary(t, "redis-cli")
	if masters < 3 {
		t.Fatalf("redistest: a Redis Cluster needs at least 3 masters, got %d", masters)
	}
	addrs := make([]string, masters)
	for i := range addrs {
		dir := t.TempDir()
		in := start(t, dir,
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "2000",
		)
		addrs[i] = in.Addr
	}

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, a := range addrs {
		if err := waitClusterOK(ctx, a); err != nil {
			t.Fatalf("redistest: cluster node %s: %v", a, err)
		}
	}
	return addrs
}

// waitClusterOK polls CLUSTER INFO until the node sees every slot served.
func waitClusterOK(ctx context.Context, addr string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, Protocol: 2})
	defer c.Close()
	var last string
	for {
		info, err := c.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return nil
		}
		last = fmt.Sprint(err, " ", info)
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster_state not ok: %w (last: %s)", ctx.Err(), strings.TrimSpace(last))
		case <-time.After(pollInterval):
		}
	}
}
