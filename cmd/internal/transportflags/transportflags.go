// Package transportflags declares the transport-security flags that
// allot-node and allot-coordinator share (TLS on their listeners,
// credentials and TLS towards Redis and NATS) and turns them into
// tlsconfig values and connection options.
package transportflags

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go"

	"github.com/allot-dev/allot/internal/tlsconfig"
)

// Flags are the parsed transport-security flags.
type Flags struct {
	tlsCert, tlsKey, tlsClientCA *string

	redisUser, redisPass, redisCA, redisCert, redisKey *string
	redisTLS                                           *bool

	natsCreds, natsUser, natsPass, natsCA, natsCert, natsKey *string
}

// Register declares the flags on fs; listeners names the listeners that
// --tls-cert secures, for the usage text.
func Register(fs *flag.FlagSet, listeners string) *Flags {
	return &Flags{
		tlsCert:     fs.String("tls-cert", "", "PEM certificate (chain) of the "+listeners+" listeners; with --tls-key serves them over TLS, reloaded when the file changes"),
		tlsKey:      fs.String("tls-key", "", "PEM private key for --tls-cert"),
		tlsClientCA: fs.String("tls-client-ca", "", "PEM CA bundle: clients of the TLS listeners must present a certificate it signed (mTLS); reloaded when the file changes"),
		redisUser:   fs.String("redis-username", "", "Redis ACL user (empty: the default user)"),
		redisPass:   fs.String("redis-password", "", "Redis password (AUTH); prefer the environment variable"),
		redisTLS:    fs.Bool("redis-tls", false, "connect to Redis over TLS (implied by --redis-tls-ca and --redis-tls-cert)"),
		redisCA:     fs.String("redis-tls-ca", "", "PEM CA bundle Redis' certificate must chain to (default: the system roots)"),
		redisCert:   fs.String("redis-tls-cert", "", "PEM client certificate for Redis (tls-auth-clients yes)"),
		redisKey:    fs.String("redis-tls-key", "", "PEM private key for --redis-tls-cert"),
		natsCreds:   fs.String("nats-creds", "", "NATS credentials file (.creds: user JWT and NKey seed)"),
		natsUser:    fs.String("nats-user", "", "NATS user name"),
		natsPass:    fs.String("nats-password", "", "NATS password for --nats-user; prefer the environment variable"),
		natsCA:      fs.String("nats-tls-ca", "", "PEM CA bundle NATS' certificate must chain to; turns TLS on (a tls:// URL uses the system roots)"),
		natsCert:    fs.String("nats-tls-cert", "", "PEM client certificate for NATS (servers with verify: true)"),
		natsKey:     fs.String("nats-tls-key", "", "PEM private key for --nats-tls-cert"),
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

// Redis returns the Redis user, password and TLS config (nil: plaintext).
func (f *Flags) Redis(log *slog.Logger) (user, password string, cfg *tls.Config, err error) {
	if *f.redisTLS || *f.redisCA != "" || *f.redisCert != "" || *f.redisKey != "" {
		cfg, err = tlsconfig.NewClient(tlsconfig.ClientOptions{CAFile: *f.redisCA, CertFile: *f.redisCert, KeyFile: *f.redisKey, Logger: log})
		if err != nil {
			return "", "", nil, fmt.Errorf("--redis-tls-*: %w", err)
		}
	}
	if *f.redisUser != "" && *f.redisPass == "" {
		return "", "", nil, errors.New("--redis-username needs --redis-password")
	}
	return *f.redisUser, *f.redisPass, cfg, nil
}

// NATS returns the options of every NATS connection: credentials and TLS.
func (f *Flags) NATS(log *slog.Logger) ([]nats.Option, error) {
	var opts []nats.Option
	switch {
	case *f.natsCreds != "" && (*f.natsUser != "" || *f.natsPass != ""):
		return nil, errors.New("set --nats-creds or --nats-user/--nats-password, not both")
	case *f.natsCreds != "":
		opts = append(opts, nats.UserCredentials(*f.natsCreds))
	case *f.natsUser != "":
		opts = append(opts, nats.UserInfo(*f.natsUser, *f.natsPass))
	case *f.natsPass != "":
		return nil, errors.New("--nats-password needs --nats-user")
	}
	if *f.natsCA != "" || *f.natsCert != "" || *f.natsKey != "" {
		cfg, err := tlsconfig.NewClient(tlsconfig.ClientOptions{CAFile: *f.natsCA, CertFile: *f.natsCert, KeyFile: *f.natsKey, Logger: log})
		if err != nil {
			return nil, fmt.Errorf("--nats-tls-*: %w", err)
		}
		opts = append(opts, nats.Secure(cfg))
	}
	return opts, nil
}
