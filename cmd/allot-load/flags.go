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
