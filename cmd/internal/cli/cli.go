// Package cli holds what allot-node, allot-coordinator and allot-sandbox
// do the same way at start: flags that fall back to ALLOT_* environment
// variables (Parse), a removed flag refused with what replaced it, on the
// command line or in the environment (removed.go), and a log/slog logger
// at a --log-level (LogLevel). It also splits comma-separated flag values
// (List, all that allot-load uses of it) and reads a README flag table
// for the tests that hold it to --help (FlagTable, TableDisagreements;
// table.go). allotctl and allot-sim do not use it.
//
// It only parses and reports: it returns errors rather than exiting, and
// starts nothing.
package cli

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/allot-dev/allot/internal/envflag"
)

// EnvPrefix is the prefix of every command's environment variables.
const EnvPrefix = "ALLOT_"

// Parse parses args into fs, then fills each flag not given on the
// command line from its ALLOT_ environment variable (the command line
// wins). The usage text names the variables.
//
// A flag that was removed (see removed) fails with what replaced it.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := checkRemoved(fs, args); err != nil {
		return err
	}
	envflag.Usage(fs, EnvPrefix)
	if err := fs.Parse(args); err != nil {
		return err
	}
	return envflag.Apply(fs, EnvPrefix)
}

// LogLevel declares --log-level (default def) and returns a function that,
// after parsing, builds a text logger at that level writing to w.
func LogLevel(fs *flag.FlagSet, def string, w io.Writer) func() (*slog.Logger, error) {
	s := fs.String("log-level", def, "log level: debug, info, warn, error")
	return func() (*slog.Logger, error) {
		var level slog.Level
		if err := level.UnmarshalText([]byte(*s)); err != nil {
			return nil, fmt.Errorf("--log-level: %w", err)
		}
		return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})), nil
	}
}

// List splits a comma-separated flag value into its items, trimmed, with
// empty items dropped ("a, b,," is a and b).
func List(s string) []string {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
