// Package envflag lets every command-line flag also be set from the
// environment: flag --grpc-addr reads ALLOT_GRPC_ADDR when not given on
// the command line. The command line wins.
//
// It only reads the environment, for flags a FlagSet already defines,
// under the prefix its caller names; it declares no flag and writes no
// variable.
package envflag

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

// Name is the environment variable for flag name under prefix.
func Name(prefix, name string) string {
	return prefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// Apply sets each flag of fs that was not set on the command line from
// its environment variable, if that is present. Call it after fs.Parse.
func Apply(fs *flag.FlagSet, prefix string) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		env := Name(prefix, f.Name)
		if v, ok := os.LookupEnv(env); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", env, v, e)
			}
		}
	})
	return err
}

// Usage appends the environment variable names to fs's usage text.
func Usage(fs *flag.FlagSet, prefix string) {
	fs.VisitAll(func(f *flag.Flag) {
		f.Usage += " (env " + Name(prefix, f.Name) + ")"
	})
}
