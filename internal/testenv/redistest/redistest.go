// Package redistest starts real redis-server processes for tests: a single
// server (Server) or a small Redis Cluster (Cluster). Every process is
// bound to 127.0.0.1, keeps no data on disk beyond t.TempDir(), and is
// killed when the test ends. The processes themselves are
// internal/redisproc's; this package binds them to a testing.TB.
package redistest

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/allot-dev/allot/internal/testenv/redisproc"
)

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

	t   testing.TB
	srv *redisproc.Server
}

// Server starts a standalone redis-server on a free port and returns once
// it answers PING. It is killed when the test ends.
func Server(t testing.TB) *Instance {
	t.Helper()
	Require(t)
	return start(t, t.TempDir())
}

// PinRedis gives redis-server a CPU of its own until the test ends
// (redisproc.PinRedis): the test process runs on the other CPUs, and
// ServerOn starts servers on the returned ones (nil when pinning is not
// possible, which is logged: the servers then run unpinned).
func PinRedis(t testing.TB) []int {
	t.Helper()
	cpus, undo := redisproc.PinRedis(slog.New(slog.NewTextHandler(tlog{t}, nil)))
	t.Cleanup(undo)
	return cpus
}

// ServerOn is Server on the given CPUs (see PinRedis).
func ServerOn(t testing.TB, cpus []int) *Instance {
	t.Helper()
	Require(t)
	return startOn(t, t.TempDir(), cpus)
}

// tlog writes log lines to t.Log.
type tlog struct{ t testing.TB }

func (w tlog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func start(t testing.TB, dir string, extra ...string) *Instance {
	t.Helper()
	return startOn(t, dir, nil, extra...)
}

func startOn(t testing.TB, dir string, cpus []int, extra ...string) *Instance {
	t.Helper()
	srv, err := redisproc.Start(context.Background(), redisproc.Options{Dir: dir, Args: extra, CPUs: cpus})
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	in := &Instance{Addr: srv.Addr, t: t, srv: srv}
	t.Cleanup(in.Kill)
	return in
}

// Kill sends SIGKILL and waits for the process to exit. Safe to call twice.
func (in *Instance) Kill() {
	in.t.Helper()
	if err := in.srv.Kill(); err != nil {
		in.t.Errorf("redistest: %v", err)
	}
}

// Pause freezes the server with SIGSTOP: connections stay open but nothing
// is answered, like a stalled or partitioned node.
func (in *Instance) Pause() {
	in.t.Helper()
	if err := in.srv.Pause(); err != nil {
		in.t.Errorf("redistest: %v", err)
	}
}

// Continue resumes a paused server with SIGCONT.
func (in *Instance) Continue() {
	in.t.Helper()
	if err := in.srv.Continue(); err != nil {
		in.t.Errorf("redistest: %v", err)
	}
}

// Restart kills the server if it runs and starts it again on the same port
// and directory (a cluster node keeps its nodes.conf, so it rejoins).
// Data is lost: persistence is off.
func (in *Instance) Restart() {
	in.t.Helper()
	if err := in.srv.Restart(context.Background()); err != nil {
		in.t.Fatalf("redistest: %v", err)
	}

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
		addrs[i] = start(t, dir, redisproc.ClusterArgs(dir)...).Addr
	}
	if err := redisproc.CreateCluster(context.Background(), addrs); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return addrs
}
