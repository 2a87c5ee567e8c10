package main

import (
	"bufio"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/node"
)

// runMainEnv makes the test binary allot-node itself (TestMain), so the
// stop tests signal a real process, as Ctrl-C in a terminal does.
const runMainEnv = "NODE_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main() // exits 1 on an error
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// nodeProc is allot-node running as a child process, its log read line by
// line.
type nodeProc struct {
	cmd   *exec.Cmd
	lines chan string // closed when the log ends
	done  chan error  // the exit, once the log ended
	mu    sync.Mutex
	log   []string
}

func startNodeProc(t *testing.T, args ...string) *nodeProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"--policies", "../../examples/policies.yaml"}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ALLOT_") { // no stray ALLOT_DRAIN_PERIOD and the like
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, runMainEnv+"=1")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &nodeProc{cmd: cmd, lines: make(chan string, 1024), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.log = append(p.log, sc.Text())
			p.mu.Unlock()
			p.lines <- sc.Text()
		}
		close(p.lines)
		p.done <- cmd.Wait() // after every read, as exec requires
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // no-op once it exited
		if t.Failed() {
			t.Logf("node log:\n%s", strings.Join(p.logLines(), "\n"))
		}
	})
	return p
}

func (p *nodeProc) logLines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.log...)
}

// waitLine returns the next log line containing every one of subs,
// failing the test if the log ends or within passes first.
func (p *nodeProc) waitLine(t *testing.T, within time.Duration, subs ...string) string {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case l, ok := <-p.lines:
			require.True(t, ok, "the node's log ended before a line with %q", subs)
			if containsAll(l, subs) {
				return l
			}
		case <-timeout:
			require.FailNow(t, "no log line", "none with %q within %v", subs, within)
		}
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// wait returns the node's exit, failing the test if it has not exited
// within.
func (p *nodeProc) wait(t *testing.T, within time.Duration) error {
	t.Helper()
	go func() {
		for range p.lines { // what is left of the log (kept in p.log)
		}
	}()
	select {
	case err := <-p.done:
		return err
	case <-time.After(within):
		require.FailNow(t, "the node did not exit", "within %v", within)
		return nil
	}
}

func (p *nodeProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig))
}

// startup is how long a node may take to start (a loaded machine, -race).
const startup = 60 * time.Second

var httpAddrRE = regexp.MustCompile(`msg="http serving" listener=http addr=(\S+)`)

// The first Ctrl-C says the node drains, for how long and that a second
// one stops it at once; the node then still serves, unready; the second
// Ctrl-C ends it long before its 30 s drain, with a last line. Before, the
// node sat out its drain without a word about it.
func TestSecondSignalStopsTheDrain(t *testing.T) {
	t.Parallel()
	const drain = 30 * time.Second
	// gRPC on every interface: a node a load balancer could reach.
	p := startNodeProc(t, "--grpc-addr", "0.0.0.0:0", "--http-addr", "127.0.0.1:0", "--drain-period", drain.String())
	m := httpAddrRE.FindStringSubmatch(p.waitLine(t, startup, `msg="http serving"`, "listener=http"))
	require.Len(t, m, 2)
	readyz := "http://" + m[1] + "/readyz"
	p.waitLine(t, startup, `msg="node serving"`)

	p.signal(t, syscall.SIGINT)
	p.waitLine(t, 10*time.Second, "draining for 30s", "Ctrl-C again", "stops at once", "signal=SIGINT", "drain_period=30s")
	// The line is logged as the drain begins: readiness flips right after.
	assert.Eventually(t, func() bool {
		resp, err := http.Get(readyz)
		if err != nil {
			return false // the node must still serve while it drains
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	}, 10*time.Second, 5*time.Millisecond, "unready, and still serving, while it drains")

	start := time.Now()
	p.signal(t, syscall.SIGINT)
	p.waitLine(t, 10*time.Second, "second signal: stopping at once", "signal=SIGINT")
	require.NoError(t, p.wait(t, drain/2), "a second signal ends the drain")
	t.Logf("stopped %v after the second signal", time.Since(start))
	lines := p.logLines()
	assert.Contains(t, lines[len(lines)-1], `msg="node stopped"`, "the last line")
}

// Without a second signal the drain runs out, then the node stops and
// says so. A --drain-period given explicitly holds on a loopback node.
func TestDrainRunsOutThenStops(t *testing.T) {
	t.Parallel()
	p := startNodeProc(t, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--drain-period", "1s")
	p.waitLine(t, startup, `msg="node serving"`)
	p.signal(t, syscall.SIGTERM)
	p.waitLine(t, 10*time.Second, "draining for 1s", "signal=SIGTERM")
	require.NoError(t, p.wait(t, 30*time.Second))
	lines := p.logLines()
	assert.Contains(t, lines[len(lines)-1], `msg="node stopped"`, "the last line")
	for _, l := range lines {
		assert.NotContains(t, l, "second signal")
	}
}

// A node whose every listener is on loopback has no load balancer to
// tell: it skips the default drain and stops at once on the first signal.
func TestLoopbackNodeSkipsTheDrain(t *testing.T) {
	t.Parallel()
	// At debug level the node logs its drain (node.Shutdown) had there
	// been one.
	p := startNodeProc(t, "--grpc-addr", "127.0.0.1:0", "--http-addr", "localhost:0", "--log-level", "debug")
	p.waitLine(t, startup, `msg="node serving"`)
	start := time.Now()
	p.signal(t, syscall.SIGINT)
	p.waitLine(t, 10*time.Second, "stopping without a drain", "every listener is on loopback", "signal=SIGINT")
	require.NoError(t, p.wait(t, 30*time.Second))
	assert.Less(t, time.Since(start), node.DefaultDrainPeriod, "it did not sit out the default drain")
	lines := p.logLines()
	assert.Contains(t, lines[len(lines)-1], `msg="node stopped"`, "the last line")
	for _, l := range lines {
		assert.NotContains(t, l, "draining")
	}
}
