package main

import (
	"context"
	"crypto/tls"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/admin"
	"github.com/allot-dev/allot/internal/testenv/certtest"
	"github.com/allot-dev/allot/internal/testenv/natstest"
	"github.com/allot-dev/allot/internal/tlsconfig"
)

// The coordinator serves the admin API over mTLS and reads its policy
// store from a NATS server that requires TLS and a user and password.
func TestAdminOverMutualTLSAndNATSWithCredentials(t *testing.T) {
	dir := t.TempDir()
	ca := certtest.NewCA(t, "coordinator test CA")
	caFile := ca.WriteCA(t, dir, "ca")
	server := ca.Server(t)
	certFile, keyFile := server.Write(t, dir, "server")
	clientCert, clientKey := ca.Client(t, "allotctl").Write(t, dir, "client")
	nsrv := natstest.ServerWith(t, natstest.Options{
		TLS:      &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{server.TLS(t)}},
		Username: "coord", Password: "pw",
	})
	// Passwords come from the environment, in the URL.
	t.Setenv("ALLOT_STORE", strings.Replace(nsrv.ClientURL(), "://", "://coord:pw@", 1))

	addr := freeAddr(t)
	done := make(chan error, 1)
	go func() {
		done <- run([]string{"--admin-addr", addr, "--admin-token", "T", "--log-level", "error",
			"--metrics-addr", "",
			"--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", caFile,
			"--client-tls-ca", caFile})
	}()

	withCert, err := tlsconfig.NewClient(tlsconfig.ClientOptions{CAFile: caFile, CertFile: clientCert, KeyFile: clientKey})
	require.NoError(t, err)
	c := admin.NewClient("https://"+addr, "T", &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: withCert}})
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := c.List(context.Background())
		if err == nil {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("coordinator stopped: %v", err)
		default:
		}
		require.True(t, time.Now().Before(deadline), "admin API did not come up: %v", err)
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	noCert, err := tlsconfig.NewClient(tlsconfig.ClientOptions{CAFile: caFile})
	require.NoError(t, err)
	_, err = admin.NewClient("https://"+addr, "T", &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: noCert}}).List(context.Background())
	assert.Error(t, err, "a client without a certificate is refused")

	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGTERM))
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("coordinator did not stop on SIGTERM")
	}
}

func TestTransportFlagErrors(t *testing.T) {
	assert.ErrorContains(t, run([]string{"--store", "memory:", "--tls-client-ca", "ca.pem"}), "--tls-client-ca needs")
	assert.ErrorContains(t, run([]string{"--store", "memory:", "--tls-cert", "missing.crt", "--tls-key", "missing.key"}), "--tls-cert")
	assert.ErrorContains(t, run([]string{"--store", "memory:", "--redis", "redis://u@h:1"}), "a user needs a password")
	assert.ErrorContains(t, run([]string{"--store", "memory:", "--redis", "rediss://h:1", "--client-tls-ca", "missing.pem"}), "--client-tls-*")
	assert.ErrorContains(t, run([]string{"--store", "memory:", "--nats-user", "u"}), "--nats-user was removed: give the user in the NATS URL")
}
