// Package transportflags declares the transport-security flags that
// allot-node and allot-coordinator share (TLS on their listeners, one
// set of client TLS files for their Redis and NATS connections, a NATS
// credentials file) and reads the --redis address, which may be a
// redis:// or rediss:// URL carrying a user and password.
//
// It turns flags into configs and options and opens nothing: the
// commands dial and listen, and package tlsconfig loads and reloads the
// certificate files.
package transportflags

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/allot-dev/allot/internal/tlsconfig"
)

// Flags are the parsed transport-security flags.
type Flags struct {
	tlsCert, tlsKey, tlsClientCA    *string
	clientCA, clientCert, clientKey *string
	natsCreds                       *string
}

// Register declares the flags on fs; listeners names the listeners that
// --tls-cert secures, for the usage text.
func Register(fs *flag.FlagSet, listeners string) *Flags {
	return &Flags{
		tlsCert:     fs.String("tls-cert", "", "PEM certificate (chain) of the "+listeners+" listeners; with --tls-key serves them over TLS, reloaded when the file changes"),
		tlsKey:      fs.String("tls-key", "", "PEM private key for --tls-cert"),
		tlsClientCA: fs.String("tls-client-ca", "", "PEM CA bundle: clients of the TLS listeners must present a certificate it signed (mTLS); reloaded when the file changes"),
		clientCA:    fs.String("client-tls-ca", "", "PEM CA bundle the certificates of Redis (rediss:// URL) and NATS (tls:// URL, or a server that requires TLS) must chain to (default: the system roots)"),
		clientCert:  fs.String("client-tls-cert", "", "PEM client certificate this process presents to Redis and NATS servers that ask for one (mTLS)"),
		clientKey:   fs.String("client-tls-key", "", "PEM private key for --client-tls-cert"),
		natsCreds:   fs.String("nats-creds", "", "NATS credentials file (.creds: user JWT and NKey seed); a user and password go in the NATS URL instead"),
	}
}

// Server is the listeners' TLS, or nil when --tls-cert is not set.
func (f *Flags) Server(log *slog.Logger) (*tlsconfig.Server, error) {
	if *f.tlsCert == "" && *f.tlsKey == "" {
		if *f.tlsClientCA != "" {
			return nil, errors.New("--tls-client-ca needs --tls-cert and --tls-key")
		}
		return nil, nil
	}
	s, err := tlsconfig.NewServer(tlsconfig.ServerOptions{CertFile: *f.tlsCert, KeyFile: *f.tlsKey, ClientCAFile: *f.tlsClientCA, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	return s, nil
}

// client builds a client TLS config from the --client-tls-* files; each
// connection kind gets its own (the NATS and Redis clients fill in server names).
func (f *Flags) client(log *slog.Logger) (*tls.Config, error) {
	cfg, err := tlsconfig.NewClient(tlsconfig.ClientOptions{CAFile: *f.clientCA, CertFile: *f.clientCert, KeyFile: *f.clientKey, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("--client-tls-*: %w", err)
	}
	return cfg, nil
}

// Redis is the region Redis a --redis value names.
type Redis struct {
	Addrs              []string
	Username, Password string
	TLS                *tls.Config // nil: plaintext
}

// Redis reads spec, a --redis value: comma-separated HOST:PORT addresses
// (plaintext, no AUTH), or a redis:// or rediss:// (TLS) URL whose
// user and password, if any, authenticate and whose host part may list
// several addresses (a cluster's seeds):
//
//	rediss://allot:s3cret@redis-1:6380,redis-2:6380
//
// TLS uses the --client-tls-* files. Errors never repeat the password.
func (f *Flags) Redis(spec string, log *slog.Logger) (Redis, error) {
	var r Redis
	hosts := spec
	scheme, rest, isURL := strings.Cut(spec, "://")
	if isURL {
		switch strings.ToLower(scheme) {
		case "redis":
		case "rediss":
			cfg, err := f.client(log)
			if err != nil {
				return r, err
			}
			r.TLS = cfg
		default:
			return r, fmt.Errorf("--redis: scheme %q: want redis:// or rediss://", scheme)
		}
		if i := strings.LastIndex(rest, "@"); i >= 0 {
			u, err := url.Parse("redis://" + rest[:i] + "@host")
			if err != nil || u.User == nil {
				return r, errors.New("--redis: the URL's user and password do not parse (percent-encode reserved characters)")
			}
			r.Username = u.User.Username()
			r.Password, _ = u.User.Password()
			rest = rest[i+1:]
		}
		hosts = strings.TrimSuffix(rest, "/")
		if strings.ContainsAny(hosts, "/?#") {
			return r, errors.New("--redis: a URL takes no database, path or options: redis[s]://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]")
		}
		if r.Username != "" && r.Password == "" {
			return r, errors.New("--redis: a user needs a password (redis://USER:PASSWORD@HOST:PORT)")
		}
	}
	for h := range strings.SplitSeq(hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			r.Addrs = append(r.Addrs, h)
		}
	}
	if isURL && len(r.Addrs) == 0 {
		return r, errors.New("--redis: the URL names no HOST:PORT")
	}
	return r, nil
}

// NATS returns the options of every NATS connection: the credentials
// file, and the --client-tls-* files for TLS, which is used when the URL
// is tls:// or the server requires it (a user and password travel in the
// URL: nats://USER:PASSWORD@HOST:PORT).
func (f *Flags) NATS(log *slog.Logger) ([]nats.Option, error) {
	var opts []nats.Option
	if *f.natsCreds != "" {
		opts = append(opts, nats.UserCredentials(*f.natsCreds))
	}
	if *f.clientCA != "" || *f.clientCert != "" || *f.clientKey != "" {
		cfg, err := f.client(log)
		if err != nil {
			return nil, err
		}
		// The config without nats.Secure: TLS stays the URL's or the
		// server's choice, so one set of files serves a plaintext NATS
		// beside a TLS Redis.
		opts = append(opts, func(o *nats.Options) error {
			o.TLSConfig = cfg
			return nil
		})
	}
	return opts, nil
}
