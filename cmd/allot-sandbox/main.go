// Command allot-sandbox runs Allot's 3-region topology on this machine
// (package sandbox): per region a 3-master Redis Cluster of real
// redis-servers, an embedded NATS server joined to the others by
// gateways, a coordinator and 2 nodes, with example global and regional
// policies. It prints where everything listens and runs until SIGINT or
// SIGTERM, then stops every process it started.
//
//	make sandbox
//	go run ./cmd/allot-sandbox --policies examples/sandbox-policies.yaml --masters 1
//
// It is a demonstration on one machine, not a deployment (deploy/ has
// those): everything it starts listens on 127.0.0.1 and is gone when it
// stops.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/allot-dev/allot/cmd/internal/cli"
	"github.com/allot-dev/allot/internal/tools/sandbox"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "allot-sandbox:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("allot-sandbox", flag.ContinueOnError)
	policies := fs.String("policies", "examples/sandbox-policies.yaml", "policy file loaded by every region")
	regions := fs.String("regions", "us,eu,ap", "region names, comma-separated")
	masters := fs.Int("masters", 3, "redis-servers per region: 3 or more make a Redis Cluster, 1 a single server")
	nodes := fs.Int("nodes", 2, "nodes per region")
	standby := fs.Bool("standby", false, "start a standby coordinator per region")
	logger := cli.LogLevel(fs, "warn", os.Stderr)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	log, err := logger()
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	sb, err := sandbox.Start(ctx, sandbox.Config{
		Regions: strings.Split(*regions, ","), Policies: *policies,
		Masters: *masters, Nodes: *nodes, Standby: *standby, Logger: log,
	})
	if err != nil {
		return err
	}
	werr := sb.WriteTable(os.Stdout)
	if werr == nil {
		fmt.Println("\nCtrl-C stops the sandbox.")
		<-ctx.Done()
	}
	fmt.Println("stopping…")
	if err := sb.Stop(); err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	fmt.Println("stopped; nothing left running")
	return werr
}
