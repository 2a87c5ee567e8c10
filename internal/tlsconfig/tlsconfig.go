// Package tlsconfig builds *tls.Config values from PEM files: server
// configs for the node's and the coordinator's listeners (TLS, or mTLS
// with a client CA) that pick up replaced certificate files without a
// restart, and client configs for Redis, NATS and gRPC connections.
//
// Reloading is lazy: a handshake looks at the files' stat data at most
// once per CheckInterval (default 1 s) and reads them again only when
// one changed. There is no watcher goroutine, so nothing has to be
// stopped, a listener nobody connects to costs nothing, and the check is
// a few stat calls per second at most whatever the handshake rate. The
// cost is that a broken replacement is noticed (and logged) on the next
// handshake rather than at once; the last good certificate keeps being
// served meanwhile, so a half-written rotation never takes a listener
// down.
//
// It reads files and builds configs: it writes no file and opens no
// connection, and it reloads certificates and keys only; a client's CA
// file is read once.
package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// DefaultCheckInterval is how often, at most, a handshake checks whether
// the certificate files changed.
const DefaultCheckInterval = time.Second

// ServerOptions name a server's files.
type ServerOptions struct {
	// CertFile and KeyFile are the PEM certificate (chain) and key. Required.
	CertFile, KeyFile string
	// ClientCAFile, when set, turns on mTLS: clients must present a
	// certificate signed by one of its PEM CAs. It is reloaded too.
	ClientCAFile string
	// CheckInterval is the least time between two checks of the files;
	// zero means DefaultCheckInterval. Tests set it tiny to see a rotation
	// on the very next handshake.
	CheckInterval time.Duration
	// Logger receives reloads and failed reloads; nil discards them.
	Logger *slog.Logger
}

// Server serves the certificate of its files, reloading them when they
// change. It is safe for concurrent use.
type Server struct {
	opts  ServerOptions
	log   *slog.Logger
	files []string

	mu      sync.Mutex
	cfg     *tls.Config   // the last good config: certificate, client CAs
	stamps  []os.FileInfo // the files as last read (or last tried)
	checked time.Time
}

// NewServer reads the files once; a missing or bad file fails here, so a
// misconfigured listener never starts.
func NewServer(opts ServerOptions) (*Server, error) {
	if opts.CertFile == "" || opts.KeyFile == "" {
		return nil, errors.New("tlsconfig: a server needs both a certificate and a key file")
	}
	if opts.CheckInterval <= 0 {
		opts.CheckInterval = DefaultCheckInterval
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{opts: opts, log: log, files: []string{opts.CertFile, opts.KeyFile}}
	if opts.ClientCAFile != "" {
		s.files = append(s.files, opts.ClientCAFile)
	}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// MutualTLS reports whether clients must present a certificate.
func (s *Server) MutualTLS() bool { return s.opts.ClientCAFile != "" }

// Config returns a server config for a listener whose ALPN protocols are
// nextProtos ("h2" for gRPC; "h2", "http/1.1" for HTTP). Every handshake
// gets the current certificate and client CAs.
func (s *Server) Config(nextProtos ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: nextProtos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			c := s.current().Clone()
			// The returned config replaces the outer one for this
			// handshake, ALPN included: gRPC refuses a connection that
			// did not negotiate h2.
			c.NextProtos = nextProtos
			return c, nil
		},
	}
}

// Reload reads the files now. On error the previous certificate stays in
// use (none, if this is the first load).
func (s *Server) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	stamps, err := stat(s.files)
	if err != nil {
		return err
	}
	s.stamps, s.checked = stamps, time.Now()
	return s.loadLocked()
}

// current returns the config to serve, first reloading it if the files
// changed since they were last read (checked at most once per interval).
func (s *Server) current() *tls.Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Since(s.checked) < s.opts.CheckInterval {
		return s.cfg
	}
	s.checked = time.Now()
	stamps, err := stat(s.files)
	if err != nil {
		s.log.Error("tls: certificate files unreadable; serving the previous certificate", "err", err)
		return s.cfg
	}
	if same(stamps, s.stamps) {
		return s.cfg
	}
	// Remember the stamps even if the load fails: the error is logged
	// once per change, and the next change (the missing half of a
	// rotation) is tried again.
	s.stamps = stamps
	if err := s.loadLocked(); err != nil {
		s.log.Error("tls: certificate reload failed; serving the previous certificate", "err", err)
	}
	return s.cfg
}

func (s *Server) loadLocked() error {
	cert, err := tls.LoadX509KeyPair(s.opts.CertFile, s.opts.KeyFile)
	if err != nil {
		return fmt.Errorf("tlsconfig: load %s and %s: %w", s.opts.CertFile, s.opts.KeyFile, err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if s.opts.ClientCAFile != "" {
		pool, err := loadPool(s.opts.ClientCAFile)
		if err != nil {
			return err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	s.cfg = cfg
	s.log.Info("tls: certificate loaded", "cert", s.opts.CertFile, "subject", cert.Leaf.Subject.String(),
		"serial", cert.Leaf.SerialNumber.String(), "not_after", cert.Leaf.NotAfter, "mtls", s.opts.ClientCAFile != "")
	return nil
}

// ClientOptions describe a client's side of a TLS connection.
type ClientOptions struct {
	// CAFile holds the PEM CAs the server's certificate must chain to;
	// empty means the system roots. Read once.
	CAFile string
	// CertFile and KeyFile are the client certificate for mTLS (both or
	// neither). They are reloaded like a server's when they change.
	CertFile, KeyFile string
	// ServerName overrides the name the server's certificate is checked
	// against; empty means the host dialled.
	ServerName string
	// CheckInterval as for ServerOptions.
	CheckInterval time.Duration
	// Logger receives failed client certificate reloads.
	Logger *slog.Logger
}

// NewClient builds a client config.
func NewClient(opts ClientOptions) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: opts.ServerName}
	if opts.CAFile != "" {
		pool, err := loadPool(opts.CAFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	switch {
	case opts.CertFile == "" && opts.KeyFile == "":
	case opts.CertFile == "" || opts.KeyFile == "":
		return nil, errors.New("tlsconfig: a client certificate needs both a certificate and a key file")
	default:
		// The same reloading holder as a server's; its first load checks
		// the pair now.
		s, err := NewServer(ServerOptions{CertFile: opts.CertFile, KeyFile: opts.KeyFile, CheckInterval: opts.CheckInterval, Logger: opts.Logger})
		if err != nil {
			return nil, err
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &s.current().Certificates[0], nil
		}
	}
	return cfg, nil
}

func loadPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tlsconfig: CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("tlsconfig: CA file %s: no PEM certificate in it", path)
	}
	return pool, nil
}

func stat(paths []string) ([]os.FileInfo, error) {
	out := make([]os.FileInfo, len(paths))
	for i, p := range paths {
		// Stat follows symlinks: a Kubernetes secret volume swaps a
		// symlinked directory, and the target is what changed.
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("tlsconfig: %w", err)
		}
		out[i] = fi
	}
	return out, nil
}

// same reports whether no file changed: same file (a rename installs a
// new one), same size, same modification time.
func same(a, b []os.FileInfo) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !os.SameFile(a[i], b[i]) || a[i].Size() != b[i].Size() || !a[i].ModTime().Equal(b[i].ModTime()) {
			return false
		}
	}
	return true
}
