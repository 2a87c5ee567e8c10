package natstest

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// Options configure a server that demands credentials and TLS.
type Options struct {
	// TLS, when set, is the server's TLS config: clients must speak TLS.
	// Set ClientAuth and ClientCAs in it to require client certificates.
	TLS *tls.Config
	// Username and Password, when set, are the only credentials accepted.
	Username, Password string
	// Operator, when set, runs the server in operator (JWT) mode: it
	// accepts only users of the accounts the operator registered, who
	// connect with a .creds file (Account.Creds). Not with Username.
	Operator *Operator
}

// ServerWith starts a JetStream-enabled nats-server configured by o and
// returns it once it accepts connections. It is shut down when the test
// ends.
func ServerWith(t testing.TB, o Options) *server.Server {
	t.Helper()
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  t.TempDir(),
		NoLog:     true,
		NoSigs:    true,
		Username:  o.Username,
		Password:  o.Password,
	}
	if o.TLS != nil {
		opts.TLS = true
		opts.TLSConfig = o.TLS
		opts.TLSVerify = o.TLS.ClientAuth == tls.RequireAndVerifyClientCert
		opts.TLSTimeout = 5 // seconds; the default 0.5 s is tight under -race
	}
	if o.Operator != nil {
		o.Operator.configure(t, opts)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("natstest: new server: %v", err)
	}
	s.Start() // does not block; its goroutines end with Shutdown
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(15 * time.Second) {
		t.Fatalf("natstest: server not ready")
	}
	return s
}

// Operator is an in-memory NATS operator for decentralized (JWT)
// authentication: it signs accounts, whose users connect with a .creds
// file (user JWT and NKey seed). Pass it in Options.Operator; the
// server then trusts it and resolves the accounts it registered.
type Operator struct {
	claims   *jwt.OperatorClaims
	kp       nkeys.KeyPair
	system   *Account
	accounts []*Account
}

// Account is an account signed by an Operator.
type Account struct {
	kp  nkeys.KeyPair
	pub string
	jwt string
}

// NewOperator makes an operator with a system account (which JetStream
// in operator mode exports its API from).
func NewOperator(t testing.TB, name string) *Operator {
	t.Helper()
	kp := newKeyPair(t, nkeys.CreateOperator)
	pub := publicKey(t, kp)
	o := &Operator{claims: jwt.NewOperatorClaims(pub)}
	o.claims.Name = name
	o.system = o.newAccount(t, kp, "SYS", false)
	o.claims.SystemAccount = o.system.pub
	signed, err := o.claims.Encode(kp)
	if err != nil {
		t.Fatalf("natstest: sign operator: %v", err)
	}
	// The server takes the claims as decoded from the signed JWT.
	if o.claims, err = jwt.DecodeOperatorClaims(signed); err != nil {
		t.Fatalf("natstest: decode operator: %v", err)
	}
	o.kp = kp
	return o
}

// Account signs a new account with JetStream enabled (unlimited) and,
// when register, adds it to the accounts the server resolves (register
// before ServerWith: the resolver is filled when the server starts); an
// unregistered account's users are refused.
func (o *Operator) Account(t testing.TB, name string, register bool) *Account {
	t.Helper()
	a := o.newAccount(t, o.kp, name, true)
	if register {
		o.accounts = append(o.accounts, a)
	}
	return a
}

func (o *Operator) newAccount(t testing.TB, signer nkeys.KeyPair, name string, jetstream bool) *Account {
	t.Helper()
	kp := newKeyPair(t, nkeys.CreateAccount)
	a := &Account{kp: kp, pub: publicKey(t, kp)}
	c := jwt.NewAccountClaims(a.pub)
	c.Name = name
	if jetstream {
		c.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	}
	var err error
	if a.jwt, err = c.Encode(signer); err != nil {
		t.Fatalf("natstest: sign account %s: %v", name, err)
	}
	return a
}

// Creds signs a new user of the account and writes its credentials
// (jwt.FormatUserConfig) to dir/name.creds, returning the path: the file
// --nats-creds names.
func (a *Account) Creds(t testing.TB, dir, name string) string {
	t.Helper()
	kp := newKeyPair(t, nkeys.CreateUser)
	c := jwt.NewUserClaims(publicKey(t, kp))
	c.Name = name
	token, err := c.Encode(a.kp)
	if err != nil {
		t.Fatalf("natstest: sign user %s: %v", name, err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatalf("natstest: user seed: %v", err)
	}
	creds, err := jwt.FormatUserConfig(token, seed)
	if err != nil {
		t.Fatalf("natstest: format creds: %v", err)
	}
	path := filepath.Join(dir, name+".creds")
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatalf("natstest: write creds: %v", err)
	}
	return path
}

// configure puts o in trusted-operator mode with a memory resolver
// holding the system account and the registered accounts.
func (o *Operator) configure(t testing.TB, opts *server.Options) {
	t.Helper()
	r := &server.MemAccResolver{}
	for _, a := range append([]*Account{o.system}, o.accounts...) {
		if err := r.Store(a.pub, a.jwt); err != nil {
			t.Fatalf("natstest: store account: %v", err)
		}
	}
	opts.TrustedOperators = []*jwt.OperatorClaims{o.claims}
	opts.AccountResolver = r
	opts.SystemAccount = o.system.pub
}

func newKeyPair(t testing.TB, create func() (nkeys.KeyPair, error)) nkeys.KeyPair {
	t.Helper()
	kp, err := create()
	if err != nil {
		t.Fatalf("natstest: nkey: %v", err)
	}
	return kp
}

func publicKey(t testing.TB, kp nkeys.KeyPair) string {
	t.Helper()
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatalf("natstest: public key: %v", err)
	}
	return pub
}
