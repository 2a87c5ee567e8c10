// Package redisproc starts and controls real redis-server processes: a
// standalone server or the masters of a small Redis Cluster, bound to
// 127.0.0.1, with persistence off and every file in a caller-given
// directory. It is what the test helper redistest and the local sandbox
// share; it owns the processes it starts and must not leave one behind:
// Kill waits for the exit, and on Linux the kernel kills the server if
// the parent dies first (Pdeathsig).
package redisproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartTimeout bounds how long a fresh server may take to answer PING,
// and a new cluster to report cluster_state:ok, when the caller's context
// has no earlier deadline.
const StartTimeout = 15 * time.Second

// startAttempts is how often a start on a free port is retried when the
// port we picked was taken by someone else before redis-server bound it.
const startAttempts = 5

// pollInterval is the pause between readiness probes.
const pollInterval = 20 * time.Millisecond

// Options describe one server.
type Options struct {
	// Dir holds the log (redis.log) and, in cluster mode, nodes.conf.
	// Required; the caller owns and removes it.
	Dir string
	// Port to bind; 0 picks a free one (retried if lost to a race).
	Port int
	// Args are extra redis-server arguments ("--cluster-enabled", "yes").
	Args []string
	// CPUs, when set, are the only CPUs the server may run on (its CPU
	// affinity, set before redis-server runs, kept across Restart); see
	// PinRedis. Linux only: elsewhere, or if the kernel refuses, the
	// server runs unpinned and a warning is logged.
	CPUs []int
}

// Server is one redis-server process.
type Server struct {
	// Addr is 127.0.0.1:port, stable across Restart.
	Addr string

	opts Options
	// busPort is the cluster bus port when Start chose it, else 0.
	busPort int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
}

// Start launches a server and returns once it answers PING.
func Start(ctx context.Context, o Options) (*Server, error) {
	if o.Dir == "" {
		return nil, errors.New("redisproc: Options.Dir is required")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("redisproc: redis-server not on PATH (apt-get install redis-server): %w", err)
	}
	attempts := 1
	if o.Port == 0 {
		attempts = startAttempts
	}
	var lastErr error
	for range attempts {
		port := o.Port
		if port == 0 {
			p, err := FreePort()
			if err != nil {
				return nil, err
			}
			port = p
		}
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), opts: o}
		if slices.Contains(o.Args, "--cluster-enabled") && !slices.Contains(o.Args, "--cluster-port") {
			// Redis's default bus port, port+10000, is never checked:
			// it can be another test's listener or connection (it falls
			// in the ephemeral range), or above 65535 for a port over
			// 55535. Pick a free one as for the port.
			bus, err := FreePort()
			if err != nil {
				return nil, err
			}
			s.busPort = bus
		}
		if lastErr = s.launch(ctx); lastErr == nil {
			return s, nil
		}
	}
	return nil, fmt.Errorf("redisproc: start redis-server: %w", lastErr)
}

// FreePort asks the kernel for an unused loopback port. Another process
// may grab it before it is bound; callers retry or fail loudly.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("redisproc: find free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// launch starts the process and waits for PING. On failure the process is
// gone and the error carries the tail of its log.
func (s *Server) launch(ctx context.Context) error {
	_, port, _ := net.SplitHostPort(s.Addr)
	args := append([]string{
		"--port", port,
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.opts.Dir,
	}, s.opts.Args...)
	if s.busPort != 0 {
		args = append(args, "--cluster-port", strconv.Itoa(s.busPort))
	}
	logf, err := os.OpenFile(filepath.Join(s.opts.Dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	cmd := exec.Command("redis-server", args...)
	cmd.Dir = s.opts.Dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = sysProcAttr()
	if err := start(cmd, s.opts.CPUs); err != nil {
		logf.Close()
		return fmt.Errorf("exec redis-server: %w", err)
	}
	done := make(chan struct{})
	// Owned by the process: it ends when redis-server exits (Kill).
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	if err := waitReady(ctx, s.Addr, done); err != nil {
		s.Kill()
		return fmt.Errorf("%s: %w\n%s", s.Addr, err, s.LogTail())
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

// LogTail is the end of the server's log, for error messages.
func (s *Server) LogTail() string {
	b, _ := os.ReadFile(filepath.Join(s.opts.Dir, "redis.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(bytes.TrimSpace(b))
}

// Signal sends sig to a running server; a server that already exited is
// not an error.
func (s *Server) Signal(sig syscall.Signal) error {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("redisproc: signal %v to %s: %w", sig, s.Addr, err)
	}
	return nil
}

// Pid is the server process's ID (0 before it started), for reading
// its CPU time from /proc.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// CPUs is the CPUs the running server may run on, as the kernel has it.
func (s *Server) CPUs() ([]int, error) {
	pid := s.Pid()
	if pid == 0 {
		return nil, errors.New("redisproc: server not started")
	}
	return processCPUs(pid)
}

// Kill sends SIGKILL and waits for the process to exit. Safe to call
// twice and on a server that already exited.
func (s *Server) Kill() error {
	err := s.Signal(syscall.SIGKILL)
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	if done != nil {
		<-done
	}
	return err
}

// Pause freezes the server with SIGSTOP: connections stay open but
// nothing is answered, like a stalled or partitioned node.
func (s *Server) Pause() error { return s.Signal(syscall.SIGSTOP) }

// Continue resumes a paused server with SIGCONT.
func (s *Server) Continue() error { return s.Signal(syscall.SIGCONT) }

// Restart kills the server if it runs and starts it again on the same
// port, directory and arguments (a cluster node keeps its nodes.conf, so
// it rejoins). Data is lost: persistence is off.
func (s *Server) Restart(ctx context.Context) error {
	if err := s.Kill(); err != nil {
		return err
	}
	var err error
	for range startAttempts {
		// The old socket can linger briefly; redis-server sets
		// SO_REUSEADDR, but another process may have taken the port.
		if err = s.launch(ctx); err == nil {
			return nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	return fmt.Errorf("redisproc: restart %s: %w", s.Addr, err)
}

// ClusterArgs are the redis-server arguments of a cluster master whose
// files live in dir.
func ClusterArgs(dir string) []string {
	return []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
		"--cluster-node-timeout", "2000",
	}
}

// CreateCluster joins running cluster-mode servers with `redis-cli
// --cluster create` (no replicas) and returns once every one reports
// cluster_state:ok. Redis needs at least 3 masters.
func CreateCluster(ctx context.Context, addrs []string) error {
	if len(addrs) < 3 {
		return fmt.Errorf("redisproc: a Redis Cluster needs at least 3 masters, got %d", len(addrs))
	}
	if _, err := exec.LookPath("redis-cli"); err != nil {
		return fmt.Errorf("redisproc: redis-cli not on PATH: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("redisproc: redis-cli --cluster create: %w\n%s", err, out)
	}
	for _, a := range addrs {
		if err := WaitClusterOK(ctx, a); err != nil {
			return fmt.Errorf("redisproc: cluster node %s: %w", a, err)
		}
	}
	return nil
}

// WaitClusterOK polls CLUSTER INFO at addr until the node sees every slot
// served.
func WaitClusterOK(ctx context.Context, addr string) error {
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
