package sweep

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/allot-dev/allot/internal/testenv/redisproc"
)

// readyTimeout bounds how long a started process may take to be ready.
const readyTimeout = 20 * time.Second

// stopTimeout is how long a process may take to exit after SIGTERM
// before it is killed.
const stopTimeout = 5 * time.Second

// proc is a child process the sweep started and must stop.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string        // path of its combined output
	done chan struct{} // closed once it has been waited for
}

// startProc runs bin with args, output to logPath.
func startProc(name, bin string, args []string, logPath string) (*proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("%s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { // owned by the process: ends when it exits
		_ = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// pid is the process's ID.
func (p *proc) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, waits up to stopTimeout, then kills; it returns
// once the process is gone. Safe to call twice.
func (p *proc) stop() {
	if p == nil {
		return
	}
	if !p.exited() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-p.done:
		return
	case <-time.After(stopTimeout):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// logTail is the end of the process's output, for error messages.
func (p *proc) logTail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(bytes.TrimSpace(b))
}

// waitUntil polls ready every 20 ms until it returns nil, the process
// exits, ctx ends or readyTimeout passes.
func (p *proc) waitUntil(ctx context.Context, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before it was ready:\n%s", p.name, p.logTail())
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w (last: %v)", p.name, ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// node is one allot-node process.
type node struct {
	*proc
	grpcAddr, httpAddr string
}

// startNode starts bin as a node on Redis redisAddr (none if empty) with
// policies, on free loopback ports, and waits for /readyz to answer 200. A port lost
// to another process between picking and binding is retried.
func startNode(ctx context.Context, hc *http.Client, bin, policies, redisAddr string, extra []string, logPath string) (*node, error) {
	var lastErr error
	for range 3 {
		g, err1 := redisproc.FreePort()
		h, err2 := redisproc.FreePort()
		if err := errors.Join(err1, err2); err != nil {
			return nil, err
		}
		n := &node{grpcAddr: loopback(g), httpAddr: loopback(h)}
		var err error
		// The metrics are served on --http-addr (no --metrics-addr).
		args := []string{"--store", policies, "--grpc-addr", n.grpcAddr, "--http-addr", n.httpAddr, "--log-level", "warn"}
		if redisAddr != "" { // empty: a standalone node (in-process counters)
			args = append(args, "--redis", redisAddr)
		}
		args = append(args, extra...)
		if n.proc, err = startProc("allot-node", bin, args, logPath); err != nil {
			return nil, err
		}
		lastErr = n.waitUntil(ctx, func(ctx context.Context) error { return httpOK(ctx, hc, "http://"+n.httpAddr+"/readyz") })
		if lastErr == nil {
			return n, nil
		}
		n.stop()
		if ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

// startNoop starts bin --noop-listen (allot-load's no-op server) on a
// free port and waits until it accepts connections.
func startNoop(ctx context.Context, bin, logPath string) (*proc, string, error) {
	var lastErr error
	for range 3 {
		port, err := redisproc.FreePort()
		if err != nil {
			return nil, "", err
		}
		addr := loopback(port)
		p, err := startProc("no-op server", bin, []string{"--noop-listen", addr}, logPath)
		if err != nil {
			return nil, "", err
		}
		lastErr = p.waitUntil(ctx, func(ctx context.Context) error {
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", addr)
			if err == nil {
				c.Close()
			}
			return err
		})
		if lastErr == nil {
			return p, addr, nil
		}
		p.stop()
		if ctx.Err() != nil {
			break
		}
	}
	return nil, "", lastErr
}

func loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// httpOK GETs url and wants 200.
func httpOK(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}
