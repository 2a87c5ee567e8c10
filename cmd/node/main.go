// Command allot-node answers CheckRateLimit over gRPC.
//
//	allot-node --policies examples/policies.yaml                 # standalone, in-process counters
//	allot-node --policies p.yaml --redis 10.0.0.1:6379           # region Redis (one instance)
//	allot-node --policies p.yaml --redis a:7000,b:7001,c:7002    # region Redis Cluster
//
// Every flag can also be set as an ALLOT_ environment variable
// (--grpc-addr is ALLOT_GRPC_ADDR); the command line wins.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/allot-dev/allot/envflag"
	"github.com/allot-dev/allot/node"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "allot-node:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("allot-node", flag.ContinueOnError)
	grpcAddr := fs.String("grpc-addr", "127.0.0.1:8081", "gRPC listen address")
	redis := fs.String("redis", "", "comma-separated region Redis addresses; empty runs standalone with in-process counters")
	policies := fs.String("policies", "", "policy file (YAML or JSON)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	shutdown := fs.Duration("shutdown-timeout", 10*time.Second, "how long in-flight calls may run after SIGTERM")
	envflag.Usage(fs, "ALLOT_")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := envflag.Apply(fs, "ALLOT_"); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	n, err := node.Start(ctx, node.Config{
		GRPCAddr:     *grpcAddr,
		Redis:        splitList(*redis),
		PoliciesPath: *policies,
		Logger:       log,
	})
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		log.Info("shutting down", "timeout", *shutdown)
	case err := <-n.Done():
		return fmt.Errorf("grpc server stopped: %w", err)
	}
	return n.Close(*shutdown)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
