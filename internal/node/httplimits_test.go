package node_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/node/nodetest"
)

// stall is the proxy's StallTimeout in these tests; gap, the pause of a
// caller or upstream that moves: a fifth of it, so a loaded machine's
// scheduling delays do not turn a moving stream into a stalled one.
const (
	stall = time.Second
	gap   = stall / 5
)

// startProxy starts a node proxying to upstream with limits l.
func startProxy(t *testing.T, upstream http.Handler, l node.HTTPLimits) *node.Node {
	t.Helper()
	up := httptest.NewServer(upstream)
	t.Cleanup(up.Close)
	n, _ := nodetest.Start(t, edgePolicies, node.Config{
		HTTPAddr: "127.0.0.1:0", Upstream: up.URL, ProxyAddr: "127.0.0.1:0",
		CheckTimeout: 30 * time.Second, HTTPLimits: l,
	})
	return n
}

// A caller that sends part of its body and then nothing is cut after
// StallTimeout, and the upstream's read of the body ends with it.
func TestProxyCutsACallerThatStopsSendingItsBody(t *testing.T) {
	upstreamRead := make(chan error, 1)
	n := startProxy(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		upstreamRead <- err
	}), node.HTTPLimits{StallTimeout: stall})
	c, err := net.Dial("tcp", n.ProxyAddr())
	require.NoError(t, err)
	defer c.Close()
	_, err = fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(30*time.Second)))
	_, err = io.Copy(io.Discard, c) // whatever the proxy answers, until it closes
	require.NoError(t, err, "the proxy closed the stalled connection (io.Copy saw EOF, not the test's deadline)")
	assert.GreaterOrEqual(t, time.Since(start), stall, "cut by the stall rule, not before it")
	select {
	case err := <-upstreamRead:
		assert.Error(t, err, "the upstream saw the body end short")
	case <-time.After(30 * time.Second):
		t.Fatal("the upstream is still reading the stalled body")
	}
}

// slowly is a body that sends n chunks, gap apart.
func slowly(n int) io.Reader {
	r, w := io.Pipe()
	go func() {
		for i := range n {
			if i > 0 {
				time.Sleep(gap) // the caller's pace: what is under test, not synchronisation
			}
			if _, err := fmt.Fprintf(w, "chunk %d\n", i); err != nil {
				return
			}
		}
		w.Close()
	}()
	return r
}

// A body that keeps moving is never cut, however long it takes in all;
// nor is a response that keeps moving after the body has ended, when no
// read sets the deadline again (the last one's must not end net/http's
// background read of the connection, and the request's context with it).
func TestProxyKeepsStreamsThatMove(t *testing.T) {
	const chunks = 8 // 8 gaps: longer than the stall timeout in all
	n := startProxy(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("X-Body-Lines", fmt.Sprint(strings.Count(string(body), "\n")))
		rc := http.NewResponseController(w)
		for i := range chunks {
			if i > 0 {
				time.Sleep(gap) // the upstream's pace
			}
			fmt.Fprintf(w, "part %d\n", i)
			if err := rc.Flush(); err != nil {
				return
			}
		}
	}), node.HTTPLimits{StallTimeout: stall})

	req, err := http.NewRequest(http.MethodPost, "http://"+n.ProxyAddr()+"/upload", slowly(chunks))
	require.NoError(t, err)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, fmt.Sprint(chunks), resp.Header.Get("X-Body-Lines"), "the whole body reached the upstream")
	lines := 0
	for sc := bufio.NewScanner(resp.Body); sc.Scan(); lines++ {
		assert.Equal(t, fmt.Sprintf("part %d", lines), sc.Text())
	}
	assert.Equal(t, chunks, lines, "the whole response reached the caller")
	assert.Greater(t, time.Since(start), 2*stall, "body and response each outlasted the stall timeout")
}

// A caller that never reads the response is cut after StallTimeout once
// the socket's buffers are full, and the upstream's writes end with it.
func TestProxyCutsACallerThatTakesNoResponse(t *testing.T) {
	const total = 1 << 30 // far more than loopback buffers hold
	wrote := make(chan int64, 1)
	n := startProxy(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunk := make([]byte, 64<<10)
		var sent int64
		for sent < total {
			k, err := w.Write(chunk)
			sent += int64(k)
			if err != nil {
				break
			}
		}
		wrote <- sent
	}), node.HTTPLimits{StallTimeout: stall})
	c, err := net.Dial("tcp", n.ProxyAddr())
	require.NoError(t, err)
	defer c.Close()
	_, err = fmt.Fprintf(c, "GET /download HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	select {
	case sent := <-wrote:
		assert.Less(t, sent, int64(total), "the upstream's writes failed before the end")
	case <-time.After(60 * time.Second):
		t.Fatal("the upstream is still writing to a caller that reads nothing")
	}
}

// With MaxConnections held by idle connections, a new caller of the HTTP
// check face waits; it is served once one of them goes.
func TestHTTPConnectionLimit(t *testing.T) {
	n, _ := nodetest.Start(t, edgePolicies, node.Config{HTTPAddr: "127.0.0.1:0", HTTPLimits: node.HTTPLimits{MaxConnections: 1}})
	hog, err := net.Dial("tcp", n.HTTPAddr())
	require.NoError(t, err)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	get := func(d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.HTTPAddr()+"/healthz", nil)
		require.NoError(t, err)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	err = get(300 * time.Millisecond)
	require.True(t, errors.Is(err, context.DeadlineExceeded), "not served while the idle connection holds the only slot: %v", err)

	require.NoError(t, hog.Close())
	require.NoError(t, get(20*time.Second))
}

// Headers are bounded on the HTTP listeners (net/http's own bound is
// 1 MiB): over maxHeaderBytes a request is answered 431, under it served.
func TestHTTPHeaderLimit(t *testing.T) {
	n, _ := nodetest.Start(t, edgePolicies, node.Config{HTTPAddr: "127.0.0.1:0"})
	get := func(size int) int {
		req, err := http.NewRequest(http.MethodGet, "http://"+n.HTTPAddr()+"/healthz", nil)
		require.NoError(t, err)
		req.Header.Set("X-Pad", strings.Repeat("x", size))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, http.StatusOK, get(32<<10))
	assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, get(100<<10))
}
