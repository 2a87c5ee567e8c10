// Command allotctl manages Allot policies through the admin API of a
// coordinator (--admin-addr).
//
//	allotctl list                          every policy, as a table
//	allotctl get ID                        one policy (YAML; -o json for JSON)
//	allotctl apply -f FILE                 create or replace one policy or every policy of a file
//	allotctl delete ID [--version N]       delete (N: only if still at version N)
//	allotctl validate -f FILE              dry run: would the store's set stay valid?
//	allotctl history ID                    versions, newest first
//	allotctl rollback ID VERSION           write an earlier version back as the newest
//
// --server URL (env ALLOT_SERVER, default http://127.0.0.1:8070) and
// --token TOKEN (env ALLOT_ADMIN_TOKEN) reach the API; -o json prints
// JSON. Errors print the server's problem details and exit 1 (2 for usage).
//
// It reaches policies only through the admin API: it never opens a
// policy store itself, and it leaves validation to the server (it only
// decodes what it sends).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/allot-dev/allot/internal/admin"
	"github.com/allot-dev/allot/internal/policystore"
	"github.com/allot-dev/allot/policy"
)

// DefaultServer is the coordinator's default admin address.
const DefaultServer = "http://127.0.0.1:8070"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// cli is one invocation: the common flags and where output goes.
type cli struct {
	server, token, output string
	timeout               time.Duration
	out, errOut           io.Writer
	client                *admin.Client
}

// errUsage marks a command line mistake (exit 2).
var errUsage = errors.New("usage")

func (c *cli) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.server, "server", c.server, "admin API URL (env ALLOT_SERVER)")
	fs.StringVar(&c.token, "token", c.token, "admin token for writes (env ALLOT_ADMIN_TOKEN)")
	fs.StringVar(&c.output, "o", c.output, "output: table or json")
	fs.DurationVar(&c.timeout, "timeout", c.timeout, "timeout of the whole command")
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := &cli{server: envOr("ALLOT_SERVER", DefaultServer), token: os.Getenv("ALLOT_ADMIN_TOKEN"),
		output: "table", timeout: 30 * time.Second, out: stdout, errOut: stderr}
	global := flag.NewFlagSet("allotctl", flag.ContinueOnError)
	global.SetOutput(stderr)
	c.flags(global)
	global.Usage = func() { fmt.Fprint(stderr, usage); global.PrintDefaults() }
	if err := global.Parse(args); err != nil {
		return 2
	}
	if global.NArg() == 0 {
		global.Usage()
		return 2
	}
	err := c.dispatch(ctx, global.Arg(0), global.Args()[1:])
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage), errors.Is(err, flag.ErrHelp):
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "allotctl:", err)
		}
		return 2
	}
	c.printError(err)
	return 1
}

const usage = `usage: allotctl [flags] COMMAND [args]
commands: list, get ID, apply -f FILE, delete ID, validate -f FILE, history ID, rollback ID VERSION
`

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// dispatch parses the command's own flags (the common ones are accepted
// after the command too) and runs it.
func (c *cli) dispatch(ctx context.Context, cmd string, args []string) error {
	fs := flag.NewFlagSet("allotctl "+cmd, flag.ContinueOnError)
	fs.SetOutput(c.errOut)
	c.flags(fs)
	file := fs.String("f", "", "policy file or single policy (YAML or JSON); - for stdin")
	version := fs.Int64("version", 0, "delete: only if the policy is still at this version")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if c.output != "table" && c.output != "json" {
		return fmt.Errorf("%w: -o %q: want table or json", errUsage, c.output)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	c.client = admin.NewClient(c.server, c.token, nil)
	need := func(n int, what string) error {
		if len(pos) != n {
			return fmt.Errorf("%w: allotctl %s %s", errUsage, cmd, what)
		}
		return nil
	}
	switch cmd {
	case "list":
		if err := need(0, ""); err != nil {
			return err
		}
		return c.list(ctx)
	case "get":
		if err := need(1, "ID"); err != nil {
			return err
		}
		return c.get(ctx, pos[0])
	case "apply", "validate":
		if err := need(0, "-f FILE"); err != nil {
			return err
		}
		if *file == "" {
			return fmt.Errorf("%w: allotctl %s -f FILE", errUsage, cmd)
		}
		return c.applyOrValidate(ctx, cmd == "apply", *file)
	case "delete":
		if err := need(1, "ID [--version N]"); err != nil {
			return err
		}
		expect := policystore.AnyVersion
		if *version > 0 {
			expect = *version
		}
		if err := c.client.Delete(ctx, pos[0], expect); err != nil {
			return err
		}
		return c.say(map[string]any{"id": pos[0], "deleted": true}, "policy/%s deleted\n", pos[0])
	case "history":
		if err := need(1, "ID"); err != nil {
			return err
		}
		return c.history(ctx, pos[0])
	case "rollback":
		if err := need(2, "ID VERSION"); err != nil {
			return err
		}
		v, err := strconv.ParseInt(pos[1], 10, 64)
		if err != nil {
			return fmt.Errorf("%w: VERSION %q is not a number", errUsage, pos[1])
		}
		return c.rollback(ctx, pos[0], v)
	}
	return fmt.Errorf("%w: unknown command %q", errUsage, cmd)
}

// parseInterleaved parses flags wherever they stand ("delete ID
// --version 3"), returning the positional arguments.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func (c *cli) list(ctx context.Context) error {
	ps, err := c.client.List(ctx)
	if err != nil {
		return err
	}
	if c.output == "json" {
		return c.json(admin.PolicyList{Policies: ps})
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tVERSION\tMODE\tMATCH\tPER\tLIMITS")
	for _, p := range ps {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", p.ID, p.Version, orDash(p.Mode, policy.ModeEnforce), matchText(p.Match), perText(p.Per), limitsText(p.Limits))
	}
	return tw.Flush()
}

func orDash(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func matchText(m policy.Match) string {
	var parts []string
	for _, kv := range [][2]string{{"tier", m.Tier}, {"tenant", m.Tenant}, {"client", m.Client}, {"route", m.Route}, {"ip", m.IP}} {
		if kv[1] != "" {
			parts = append(parts, kv[0]+"="+kv[1])
		}
	}
	if len(parts) == 0 {
		return "*"
	}
	return strings.Join(parts, ",")
}

func perText(per []policy.Field) string {
	if len(per) == 0 {
		return "-"
	}
	s := make([]string, len(per))
	for i, f := range per {
		s[i] = string(f)
	}
	return strings.Join(s, ",")
}

func limitsText(ls []policy.Limit) string {
	s := make([]string, len(ls))
	for i, l := range ls {
		s[i] = fmt.Sprintf("%s=%d/%v", l.Name, l.Limit, time.Duration(l.Period))
		if l.Burst > 0 {
			s[i] += fmt.Sprintf(" burst %d", l.Burst)
		}
		s[i] += " " + l.Algorithm
	}
	return strings.Join(s, "; ")
}

func (c *cli) get(ctx context.Context, id string) error {
	p, err := c.client.Get(ctx, id)
	if err != nil {
		return err
	}
	if c.output == "json" {
		return c.json(p)
	}
	data, err := policystore.EncodeYAML(p)
	if err != nil {
		return err
	}
	_, err = c.out.Write(data)
	return err
}

// readInput reads FILE (or stdin for -) as one policy or a whole file.
func readInput(path string) (*policy.File, bool, error) {
	var (
		data []byte
		err  error
	)
	if path == "-" {
		data, err = io.ReadAll(os.Stdin)
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, false, err
	}
	var top map[string]any
	if err := yaml.Unmarshal(data, &top); err != nil {
		return nil, false, fmt.Errorf("%s: %w", path, err)
	}
	if admin.IsFileKeys(func(k string) bool { _, ok := top[k]; return ok }) {
		f, err := policy.Parse(path, data)
		return f, true, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true) // a misspelt field is a limit silently not enforced
	var p policy.Policy
	if err := dec.Decode(&p); err != nil {
		return nil, false, fmt.Errorf("%s: %w", path, err)
	}
	return &policy.File{Policies: []policy.Policy{p}}, false, nil
}

// applyOrValidate dry-runs the input as a whole against the store's set,
// then (apply) writes the settings if the file has any and each policy.
func (c *cli) applyOrValidate(ctx context.Context, apply bool, path string) error {
	f, isFile, err := readInput(path)
	if err != nil {
		return err
	}
	var body any = f
	if !isFile {
		body = f.Policies[0]
	}
	res, err := c.client.Validate(ctx, body)
	if err != nil {
		return err
	}
	for _, w := range res.Warnings {
		fmt.Fprintf(c.errOut, "warning: policy %q: %s: %s\n", w.Policy, w.Field, w.Message)
	}
	if !apply {
		return c.say(res, "valid: the resulting set has %d policies\n", res.Policies)
	}
	type result struct {
		ID      string `json:"id,omitempty"`
		What    string `json:"what"`
		Version int64  `json:"version"`
	}
	var results []result
	if isFile && admin.HasSettings(f) {
		st, err := c.client.PutSettings(ctx, policystore.SettingsOf(f), policystore.AnyVersion)
		if err != nil {
			return fmt.Errorf("settings: %w", err)
		}
		results = append(results, result{What: "settings", Version: st.Version})
	}
	for _, p := range f.Policies {
		stored, err := c.client.Put(ctx, p, policystore.AnyVersion)
		if err != nil {
			return fmt.Errorf("policy %q: %w", p.ID, err)
		}
		results = append(results, result{ID: stored.ID, What: "policy", Version: stored.Version})
	}
	if c.output == "json" {
		return c.json(results)
	}
	for _, r := range results {
		if r.ID == "" {
			fmt.Fprintf(c.out, "settings configured (version %d)\n", r.Version)
			continue
		}
		fmt.Fprintf(c.out, "policy/%s configured (version %d)\n", r.ID, r.Version)
	}
	return nil
}

func (c *cli) history(ctx context.Context, id string) error {
	vs, err := c.client.History(ctx, id)
	if err != nil {
		return err
	}
	if c.output == "json" {
		return c.json(admin.History{ID: id, Versions: vs})
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tTIME\tCHANGE")
	for _, v := range vs {
		change := "deleted"
		if v.Policy != nil {
			change = limitsText(v.Policy.Limits)
		}
		at := "-"
		if !v.Time.IsZero() {
			at = v.Time.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\n", v.Version, at, change)
	}
	return tw.Flush()
}

// rollback writes an earlier version back; it is a new version, so the
// history keeps what was rolled back.
func (c *cli) rollback(ctx context.Context, id string, version int64) error {
	vs, err := c.client.History(ctx, id)
	if err != nil {
		return err
	}
	for _, v := range vs {
		if v.Version == version && v.Policy != nil {
			current := policystore.AnyVersion
			if !vs[0].Deleted {
				current = vs[0].Version // fail if someone wrote meanwhile
			}
			stored, err := c.client.Put(ctx, *v.Policy, current)
			if err != nil {
				return err
			}
			return c.say(stored, "policy/%s rolled back to version %d (now version %d)\n", id, version, stored.Version)
		}
	}
	return fmt.Errorf("policy %q has no version %d with content in its history", id, version)
}

// say prints v as JSON, or the formatted text.
func (c *cli) say(v any, format string, args ...any) error {
	if c.output == "json" {
		return c.json(v)
	}
	_, err := fmt.Fprintf(c.out, format, args...)
	return err
}

func (c *cli) json(v any) error {
	enc := json.NewEncoder(c.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printError prints the server's problem details (as JSON with -o json).
func (c *cli) printError(err error) {
	var p *admin.Problem
	if errors.As(err, &p) && c.output == "json" {
		enc := json.NewEncoder(c.errOut)
		enc.SetIndent("", "  ")
		_ = enc.Encode(p) // stderr is gone; nothing to do
		return
	}
	fmt.Fprintln(c.errOut, "allotctl:", err)
}
