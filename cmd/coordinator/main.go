// Command allot-coordinator serves the policy admin API over a policy
// store and, with --region, runs the region's multi-region coordinator:
// it exchanges per-key demand with the other regions over NATS and
// rebalances this region's share of global limits (docs/multi-region.md;
// flags in rebalance.go).
//
//	allot-coordinator --store nats://127.0.0.1:4222 --admin-token T
//	allot-coordinator --store postgres://allot@db/allot --admin-addr 0.0.0.0:8070 --admin-token T
//	allot-coordinator --store examples/policies.yaml              # = --store file:examples/policies.yaml
//
// Every flag can also be set as an ALLOT_ environment variable
// (--admin-token is ALLOT_ADMIN_TOKEN); the command line wins. The
// rebalance knobs are the policy file's rebalance: block
// (docs/multi-region.md); spans go to OTEL_EXPORTER_OTLP_ENDPOINT. SIGINT
// or SIGTERM stops it, letting admin requests in flight finish.
//
// This command only wires flags, the environment and signals to the
// packages that do the work (internal/admin, internal/policystore,
// coord.StartProcess, internal/telemetry) and serves their /metrics; it
// holds no policy or share logic of its own.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/allot-dev/allot/cmd/internal/cli"
	"github.com/allot-dev/allot/cmd/internal/transportflags"
	"github.com/allot-dev/allot/internal/admin"
	"github.com/allot-dev/allot/internal/policystore"
	"github.com/allot-dev/allot/internal/telemetry"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "allot-coordinator:", err)
		os.Exit(1)
	}
}

// flags are allot-coordinator's command line (README, "Coordinator
// flags"; the test there holds the two equal).
type flags struct {
	store, policies, adminAddr, adminToken, metricsAddr *string
	logger                                              func() (*slog.Logger, error)
	rebalance                                           *rebalanceFlags
	transport                                           *transportflags.Flags
}

// register declares every flag of allot-coordinator on fs.
func register(fs *flag.FlagSet) *flags {
	f := &flags{
		store:       fs.String("store", "", "policy store: a policy file PATH (also file:PATH), nats://HOST:PORT (JetStream KV allot-policies) or postgres://..."),
		policies:    fs.String("policies", "", "policy file; shorthand for --store file:PATH"),
		adminAddr:   fs.String("admin-addr", "127.0.0.1:8070", "admin API listen address; off loopback it needs --admin-token"),
		adminToken:  fs.String("admin-token", "", "bearer token admin API writes must present"),
		metricsAddr: fs.String("metrics-addr", "127.0.0.1:9470", "listen address of GET /metrics (Prometheus: rebalance rounds); empty disables"),
	}
	f.logger = cli.LogLevel(fs, "info", os.Stderr)
	f.rebalance = addRebalanceFlags(fs)
	f.transport = transportflags.Register(fs, "admin API")
	return f
}

func run(args []string) error {
	fs := flag.NewFlagSet("allot-coordinator", flag.ContinueOnError)
	f := register(fs)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	rebalance := f.rebalance
	log, err := f.logger()
	if err != nil {
		return err
	}
	tr, err := newTransport(f.transport, *rebalance.redis, log)
	if err != nil {
		return err
	}
	rebalance.transport = tr
	url, err := storeURL(*f.store, *f.policies)
	if err != nil {
		return err
	}
	if err := admin.CheckAddr(*f.adminAddr, *f.adminToken); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	serving := false
	defer func() { // the last line, once the store, telemetry and rebalancer closed
		if serving {
			log.Info("coordinator stopped")
		}
	}()
	st, err := policystore.Open(ctx, url, policystore.Options{Logger: log, NATS: tr.nats})
	if err != nil {
		return err
	}
	defer st.Close()
	tel, err := telemetry.New(ctx, telemetry.Config{Service: "allot-coordinator", OTLPEndpoint: telemetry.EnvEndpoint(), Logger: log})
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tel.Shutdown(sctx); err != nil {
			log.Warn("telemetry shutdown", "err", err)
		}
	}()
	stopMetrics, err := serveMetrics(ctx, *f.metricsAddr, tel, log)
	if err != nil {
		return err
	}
	defer stopMetrics()
	rebalance.observe = tel.ObserveRebalance
	waitRebalance, err := rebalance.start(ctx, st, log)
	if err != nil {
		return err
	}
	defer waitRebalance()
	lis, err := net.Listen("tcp", *f.adminAddr)
	if err != nil {
		return fmt.Errorf("admin API: listen on %s: %w", *f.adminAddr, err)
	}
	lis = tr.listener(lis)
	if *f.adminToken == "" {
		log.Warn("admin API without a token: writes are open to anyone on this host")
	}
	log.Info("coordinator serving the admin API", "addr", lis.Addr().String(), "store", st.String())
	serving = true
	return admin.New(admin.Config{Store: st, Token: *f.adminToken, Logger: log}).Serve(ctx, lis)
}

// storeURL is --store as a store URL: a path without a scheme is a
// policy file.
func storeURL(store, policies string) (string, error) {
	switch {
	case store != "" && policies != "":
		return "", errors.New("--store and --policies both given: --policies PATH is --store file:PATH")
	case policies != "":
		return "file:" + policies, nil
	case store == "":
		return "", errors.New("no policy store: set --store URL (or a policy file PATH)")
	case strings.Contains(store, "://") || strings.HasPrefix(store, "file:") || strings.HasPrefix(store, "memory:"):
		return store, nil
	}
	return "file:" + store, nil
}

// serveMetrics serves GET /metrics on addr until ctx ends or the returned
// stop is called; stop returns once the server has stopped. An empty addr
// serves nothing.
func serveMetrics(ctx context.Context, addr string, tel *telemetry.Telemetry, log *slog.Logger) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", tel.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 30 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "err", err)
		}
	}()
	ctx, cancel := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			_ = srv.Close()
		}
	}()
	log.Info("metrics serving", "addr", lis.Addr().String())
	return func() { cancel(); <-stopped; <-served }, nil
}
