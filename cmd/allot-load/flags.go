package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/allot-dev/allot/internal/envflag"
)

// cmdFlags is the flag set of allot-load or one of its subcommands, with
// every flag settable from the environment under prefix (envflag).
type cmdFlags struct {
	*flag.FlagSet
	prefix string
}

func newFlags(name, prefix string, stderr io.Writer) cmdFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return cmdFlags{FlagSet: fs, prefix: prefix}
}

// parse reads args, refuses positional arguments, then fills the flags
// not given on the command line from the environment.
func (f cmdFlags) parse(args []string) error {
	envflag.Usage(f.FlagSet, f.prefix)
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		err := fmt.Errorf("unexpected arguments %q", f.Args())
		if sub := strings.TrimSpace(strings.TrimPrefix(f.Name(), "allot-load")); sub != "" {
			err = fmt.Errorf("%s: %w", sub, err)
		}
		return err
	}
	return envflag.Apply(f.FlagSet, f.prefix)
}

// nodeFlags are the node binary and its extra flags, for the subcommands
// that start a node (sweep, ratio).
type nodeFlags struct {
	bin, args *string
}

func (f cmdFlags) nodeFlags(binUsage, argsExample string) nodeFlags {
	return nodeFlags{
		bin:  f.String("node-bin", "bin/allot-node", binUsage),
		args: f.String("node-args", "", "extra allot-node flags, space-separated (e.g. \""+argsExample+"\")"),
	}
}

// check refuses a node binary that is not there, before anything starts.
func (n nodeFlags) check() error {
	if _, err := os.Stat(*n.bin); err != nil {
		return fmt.Errorf("--node-bin: %w (make build writes bin/allot-node)", err)
	}
	return nil
}

func (n nodeFlags) extra() []string { return strings.Fields(*n.args) }

// redisCPU is --redis-cpu, for the subcommands that start a
// redis-server (sweep, ratio).
type redisCPU struct{ v *string }

func (f cmdFlags) redisCPU() redisCPU {
	return redisCPU{f.String("redis-cpu", "last",
		"CPU of redis-server: last (the last CPU is Redis's alone, as on a Redis host of its own; the node, the no-op server "+
			"and the generator share the others; Linux with 2+ CPUs, else unpinned) or none (Redis shares every CPU)")}
}

// shared reports whether Redis shares the CPUs (--redis-cpu none).
func (r redisCPU) shared() (bool, error) {
	switch *r.v {
	case "last":
		return false, nil
	case "none":
		return true, nil
	}
	return false, fmt.Errorf("--redis-cpu %q: want last or none", *r.v)
}
