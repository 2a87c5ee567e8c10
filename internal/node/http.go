package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"

	"github.com/allot-dev/allot/internal/ratelog"
	"github.com/allot-dev/allot/internal/server"
	"github.com/allot-dev/allot/middleware"
)

// httpListener is one HTTP server of the node: the check API or the
// reverse proxy. Its serve goroutine closes done when it returns.
type httpListener struct {
	name string
	srv  *http.Server
	lis  net.Listener
	done chan struct{}
}

// startHTTP starts the HTTP face (cfg.HTTPAddr) and, with cfg.Upstream,
// the reverse proxy (cfg.ProxyAddr). The proxy has its own listener so
// that no upstream path is shadowed and callers of the proxied API cannot
// reach /v1/check and spend other callers' tokens.
func (n *Node) startHTTP() error {
	if n.cfg.HTTPAddr != "" {
		h := server.NewHTTP(n.checker(), server.HTTPOptions{Logger: n.log, Ready: func() bool { return !n.closing.Load() }, Status: n.StoreStatus, Observe: n.observeHook()})
		srv := &http.Server{Handler: n.httpTelemetry(h), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
		if err := n.serveHTTP("http", n.cfg.HTTPAddr, srv); err != nil {
			return err
		}
	}
	if n.cfg.Upstream == "" {
		return nil
	}
	h, err := n.proxyHandler()
	if err != nil {
		return err
	}
	// No read or write timeout: proxied bodies may stream for long. A
	// caller that stalls is cut by cutStalled instead.
	srv := &http.Server{Handler: n.cfg.HTTPLimits.cutStalled(h), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute}
	return n.serveHTTP("proxy", n.cfg.ProxyAddr, srv)
}

func (n *Node) proxyHandler() (http.Handler, error) {
	up, err := url.Parse(n.cfg.Upstream)
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	if (up.Scheme != "http" && up.Scheme != "https") || up.Host == "" {
		return nil, fmt.Errorf("upstream %q: want an http:// or https:// URL with a host", n.cfg.Upstream)
	}
	if n.cfg.ProxyAddr == "" {
		return nil, errors.New("upstream is set but the proxy listen address is empty")
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			// Keep the chain the trusted proxies built, so the upstream
			// can apply its own trust rules, and add our peer to it.
			pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
			pr.SetXForwarded()
		},
		ErrorLog: ratelog.StdLogger(n.perRequestLog(), "proxy error"),
	}
	lim, err := middleware.New(middleware.Options{
		// In process: the proxy is the node, so no network hop.
		Check:    server.NewGRPC(n.checker()).CheckRateLimit,
		Identity: n.cfg.Identity,
		Timeout:  n.cfg.CheckTimeout,
		Logger:   n.perRequestLog(), // a warning per request that fails open
	})
	if err != nil {
		return nil, err
	}
	return lim.Wrap(proxy), nil
}

func (n *Node) serveHTTP(name, addr string, srv *http.Server) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s: listen on %s: %w", name, addr, err)
	}
	lis = n.cfg.HTTPLimits.listener(lis)
	srv.MaxHeaderBytes = maxHeaderBytes
	// One line per failed TLS handshake or broken connection: limited.
	srv.ErrorLog = ratelog.StdLogger(n.perRequestLog(), name+" server error")
	l := &httpListener{name: name, srv: srv, lis: lis, done: make(chan struct{})}
	n.https = append(n.https, l)
	go func() {
		defer close(l.done)
		if err := n.cfg.Transport.serveHTTP(srv, lis); !errors.Is(err, http.ErrServerClosed) {
			select {
			case n.httpFailed <- fmt.Errorf("%s server: %w", name, err):
			default: // one failure is enough to stop the node
			}
		}
	}()
	n.log.Info("http serving", "listener", name, "addr", lis.Addr().String(), "upstream", n.cfg.Upstream)
	return nil
}

// closeHTTP shuts the HTTP servers down: no new requests, in-flight ones
// finish until ctx ends, then open connections are cut (with a warning
// when ctx timed out; none when it was cancelled: a stop at once).
func (n *Node) closeHTTP(ctx context.Context) error {
	var errs []error
	for _, l := range n.https {
		if err := l.srv.Shutdown(ctx); err != nil {
			if !errors.Is(err, context.Canceled) {
				n.log.Warn("graceful http stop timed out; closing connections", "listener", l.name, "err", err)
			}
			errs = append(errs, l.srv.Close())
		}
		<-l.done
	}
	n.https = nil
	return errors.Join(errs...)
}

// HTTPAddr is the HTTP check listener's address, or "" if it is disabled.
func (n *Node) HTTPAddr() string { return n.httpAddr("http") }

// ProxyAddr is the reverse proxy's address, or "" without an upstream.
func (n *Node) ProxyAddr() string { return n.httpAddr("proxy") }

func (n *Node) httpAddr(name string) string {
	for _, l := range n.https {
		if l.name == name {
			return l.lis.Addr().String()
		}
	}
	return ""
}

// HTTPFailed delivers the error of an HTTP server that stopped serving on
// its own (not by Close).
func (n *Node) HTTPFailed() <-chan error { return n.httpFailed }
