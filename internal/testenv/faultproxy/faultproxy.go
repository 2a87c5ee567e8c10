// Package faultproxy is a TCP proxy for tests that injects the faults this
// kernel cannot (no netem): added latency, a black hole that accepts and
// swallows traffic (a frozen peer), and a cut that resets every
// connection (a partition or a dead peer).
package faultproxy

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy forwards connections from Addr to a target.
type Proxy struct {
	Addr   string
	target string
	lis    net.Listener

	latency atomic.Int64 // nanoseconds added before each forwarded chunk
	hole    atomic.Bool  // swallow traffic, answer nothing
	drop    atomic.Bool  // forward requests, then cut instead of replying
	cut     atomic.Bool  // refuse and reset connections
	admit   atomic.Pointer[func(line []byte) bool]

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// New starts a proxy to target on a free loopback port; it stops with the
// test.
func New(t testing.TB, target string) *Proxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("faultproxy: listen: %v", err)
	}
	p := &Proxy{Addr: lis.Addr().String(), target: target, lis: lis, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// SetLatency delays every chunk in both directions by d (0 removes it).
func (p *Proxy) SetLatency(d time.Duration) { p.latency.Store(int64(d)) }

// BlackHole makes the proxy accept and read but never forward or answer,
// like a peer that froze (SIGSTOP) or a dropped-packet partition.
func (p *Proxy) BlackHole(on bool) { p.hole.Store(on) }

// DropReplies makes the proxy forward what clients send but close the
// connection instead of forwarding the server's answer: the request ran,
// its reply is lost (a connection broken at the worst moment).
func (p *Proxy) DropReplies(on bool) { p.drop.Store(on) }

// Cut resets every open connection and refuses new ones until Heal.
func (p *Proxy) Cut() {
	p.cut.Store(true)
	p.mu.Lock()
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) // RST, not FIN: the peer sees a failure at once
		}
		c.Close()
	}
	p.mu.Unlock()
}

// AdmitFirstLine makes the proxy check the first line (up to and
// including '\n', at most 64 KiB) that each client sends: a connection
// whose line admit rejects is closed before any of it reaches the target.
// The target's side is forwarded meanwhile, so protocols whose server
// speaks first (NATS sends INFO, the client answers CONNECT) still work.
// nil admits every connection.
func (p *Proxy) AdmitFirstLine(admit func(line []byte) bool) {
	if admit == nil {
		p.admit.Store(nil)
		return
	}
	p.admit.Store(&admit)
}

// Heal undoes Cut, BlackHole and SetLatency.
func (p *Proxy) Heal() {
	p.cut.Store(false)
	p.hole.Store(false)
	p.latency.Store(0)
}

// Close stops the proxy and its connections.
func (p *Proxy) Close() {
	p.lis.Close()
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut.Load() {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			c.Close()
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	server, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		return
	}
	if !p.track(server) {
		server.Close()
		return
	}
	defer p.untrack(server)
	done := make(chan struct{}, 2)
	go func() {
		if src, ok := p.admitted(client, server); ok {
			p.pipe(server, src, false)
		}
		done <- struct{}{}
	}()
	go func() { p.pipe(client, server, true); done <- struct{}{} }()
	<-done
	// One side ended: close both so the other pipe ends too.
	client.Close()
	server.Close()
	<-done
}

// admitted reads client's first line when AdmitFirstLine is set, and
// forwards it to server if admitted; it returns what to read the rest of
// the client's side from.
func (p *Proxy) admitted(client io.Reader, server io.Writer) (io.Reader, bool) {
	f := p.admit.Load()
	if f == nil {
		return client, true
	}
	br := bufio.NewReaderSize(client, 64<<10)
	line, err := br.ReadSlice('\n')
	if err != nil || !bytes.HasSuffix(line, []byte("\n")) || !(*f)(line) {
		return nil, false
	}
	if _, err := server.Write(line); err != nil {
		return nil, false
	}
	return br, true
}

// pipe copies src to dst with the faults in force; reply says src is
// the server.
func (p *Proxy) pipe(dst io.Writer, src io.Reader, reply bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && reply && p.drop.Load() {
			return // the caller closes both sides: the answer is lost
		}
		if n > 0 {
			if d := time.Duration(p.latency.Load()); d > 0 {
				time.Sleep(d) // the fault being injected, not synchronisation
			}
			if !p.hole.Load() {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return // EOF or reset: the caller closes both sides
		}
	}
}
