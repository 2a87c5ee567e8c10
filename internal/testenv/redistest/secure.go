package redistest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/internal/testenv/redisproc"
)

// Options configure a server that demands what production Redis does:
// TLS and ACL users.
type Options struct {
	// TLS, when set, serves TLS on a port of its own and closes the
	// plaintext port once the server is ready.
	TLS *TLS
	// Users are ACL users (name to password) allowed every key, channel
	// and command. When there are any, the default user is switched off,
	// so every client must authenticate.
	Users map[string]string
}

// TLS names the server's PEM files (see internal/certtest).
type TLS struct {
	CertFile, KeyFile string
	// CAFile holds the CAs client certificates must chain to.
	CAFile string
	// AuthClients is redis' tls-auth-clients: "yes" (the default here,
	// as in Redis: a client certificate is required), "optional" or "no".
	AuthClients string
}

// Secure is a server started by ServerWith.
type Secure struct {
	// Addr is where clients connect: the TLS port with Options.TLS,
	// else the plaintext port.
	Addr string
	*Instance
}

// ServerWith starts a standalone redis-server configured by o. Redis'
// own readiness probe runs on the plaintext port as the default user;
// only then are the plaintext port closed and the default user switched
// off (CONFIG SET and ACL SETUSER at run time), so a Restart of such a
// server is not supported.
func ServerWith(t testing.TB, o Options) *Secure {
	t.Helper()
	Require(t)
	var args []string
	for name, pass := range o.Users {
		args = append(args, "--user", name, "on", ">"+pass, "~*", "&*", "+@all")
	}
	var tlsPort int
	if o.TLS != nil {
		auth := o.TLS.AuthClients
		if auth == "" {
			auth = "yes"
		}
		p, err := redisproc.FreePort()
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		tlsPort = p
		args = append(args, "--tls-port", fmt.Sprint(tlsPort),
			"--tls-cert-file", o.TLS.CertFile, "--tls-key-file", o.TLS.KeyFile,
			"--tls-ca-cert-file", o.TLS.CAFile, "--tls-auth-clients", auth)
	}
	in := start(t, t.TempDir(), args...)
	s := &Secure{Addr: in.Addr, Instance: in}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: in.Addr, MaxRetries: -1, Protocol: 2})
	defer c.Close()
	if o.TLS != nil {
		if err := c.ConfigSet(ctx, "port", "0").Err(); err != nil {
			t.Fatalf("redistest: close the plaintext port: %v", err)
		}
		s.Addr = fmt.Sprintf("127.0.0.1:%d", tlsPort)
	}
	if len(o.Users) > 0 {
		// The connection itself stays open after the port closed, but
		// Redis drops it once its user is switched off; that is fine.
		if err := c.Do(ctx, "ACL", "SETUSER", "default", "off").Err(); err != nil {
			t.Fatalf("redistest: switch the default user off: %v", err)
		}
	}
	return s
}
