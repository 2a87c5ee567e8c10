package node

import (
	"io"
	"net"
	"net/http"
	"time"
)

// HTTPLimits bound what callers can hold of the HTTP listeners (the check
// face, the reverse proxy and the metrics listener), as GRPCLimits do of
// the gRPC one. Zero fields take the defaults below.
type HTTPLimits struct {
	// MaxConnections is the most connections each HTTP listener serves
	// at once; more wait in the kernel's accept queue until one closes.
	// Without it, a flood of connections to one face spends the file
	// descriptors every listener of the node shares. Negative: unlimited.
	MaxConnections int
	// StallTimeout cuts a proxied request whose caller has neither sent
	// a byte of its body nor taken one of the response for this long
	// (between two reads or two writes, as nginx's client_body_timeout
	// and send_timeout; not the whole transfer, so a long stream that
	// moves is never cut). The check face has whole-request timeouts of
	// its own: its bodies and answers are small.
	StallTimeout time.Duration
}

// Defaults of HTTPLimits: the gRPC listener's connection cap, and
// nginx's 60 s between reads and between writes.
const (
	DefaultHTTPMaxConnections = DefaultGRPCMaxConnections
	DefaultHTTPStallTimeout   = time.Minute
)

func (l HTTPLimits) withDefaults() HTTPLimits {
	if l.MaxConnections == 0 {
		l.MaxConnections = DefaultHTTPMaxConnections
	}
	if l.StallTimeout <= 0 {
		l.StallTimeout = DefaultHTTPStallTimeout
	}
	return l
}

func (l HTTPLimits) listener(lis net.Listener) net.Listener {
	return limitConnections(lis, l.withDefaults().MaxConnections)
}

// cutStalled bounds each wait of h on its caller by l.StallTimeout: a
// socket deadline set before every read of the request body and every
// write of the response, so a caller that trickles nothing, or takes
// nothing, frees its connection and the upstream's. The proxy's server
// has no whole-request timeouts (its bodies may stream for long), so
// this is what ends a slow caller there.
func (l HTTPLimits) cutStalled(h http.Handler) http.Handler {
	d := l.withDefaults().StallTimeout
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// net/http clears both deadlines between two requests of a
		// connection, so a kept-alive one starts with none.
		rc := http.NewResponseController(w)
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = &stallBody{ReadCloser: r.Body, rc: rc, d: d}
		}
		h.ServeHTTP(&stallWriter{ResponseWriter: w, rc: rc, d: d}, r)
	})
}

// stallBody sets the read deadline before each read of a request body.
// Nothing clears it after the last: at the body's end net/http clears it
// itself, to begin its background read of the connection (net/http's
// connReader.startBackgroundRead), and after a body cut short the
// server's read of the rest must fail too, not wait for the caller.
type stallBody struct {
	io.ReadCloser
	rc *http.ResponseController
	d  time.Duration
}

func (b *stallBody) Read(p []byte) (int, error) {
	_ = b.rc.SetReadDeadline(time.Now().Add(b.d))
	return b.ReadCloser.Read(p)
}

// stallWriter sets the write deadline before each write and flush of a
// response. Unwrap lets http.ResponseController (the reverse proxy's
// flushes) reach the server's writer.
type stallWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

func (w *stallWriter) Write(p []byte) (int, error) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.d))
	return w.ResponseWriter.Write(p)
}

func (w *stallWriter) FlushError() error {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.d))
	return w.rc.Flush()
}

func (w *stallWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
