// Command simdocs regenerates the tables of docs/simulation.md (issue 44,
// point 7): it runs the commands each table shows (allot-sim built from
// this tree, go test of internal/tools/sim, and with -sandbox the real
// sandbox and load generator), reads what they print, and rewrites the
// doc's generated regions
//
//	<!-- simdocs:NAME begin -->
//	...
//	<!-- simdocs:NAME end sha256=HASH -->
//
// leaving the prose between them as it is. Each region names the commit
// it was made at, shows its commands in a fenced block, then its tables;
// HASH (of the body) makes a hand edit inside a region visible to
// -check, which TestDocRegions runs without running anything.
//
//	make simdocs                          # every region but speed and sandbox (about 6 minutes)
//	go run ./internal/tools/simdocs -big -sandbox -only speed,sandbox
//	go run ./internal/tools/simdocs -check
//
// The same commands at the same commit print the same figures, except
// the runs' costs (the speed and acceptance regions' wall times, CPU and
// memory) and the sandbox's real processes.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "simdocs:", err)
		os.Exit(1)
	}
}

// gen is one regeneration.
type gen struct {
	bin    string // where allot-sim (and allot-sandbox, allot-load) were built
	jobs   int
	commit string

	mu    sync.Mutex
	cache map[string]*result // by allot-sim's arguments
	runs  atomic.Int64
}

// section makes one region's body.
type section struct {
	name string
	// optIn is the flag without which the region keeps its body: its
	// runs are long or need real processes.
	optIn string
	make  func(*gen) (string, error)
}

func names() []string {
	var out []string
	for _, s := range sections {
		out = append(out, s.name)
	}
	return out
}

func run(args []string) error {
	fs := flag.NewFlagSet("simdocs", flag.ContinueOnError)
	docPath := fs.String("doc", "docs/simulation.md", "the doc, from the repository's root")
	checkOnly := fs.Bool("check", false, "only check the doc's generated regions (markers paired, commands before tables, no hand edits); run nothing")
	only := fs.String("only", "", "regenerate only these regions, comma-separated (default: all but the opt-in ones)")
	big := fs.Bool("big", false, "include the speed region: 10 regions x 64 nodes, 10^6 keys, every fault flag (about 9 minutes and 5.6 GB)")
	sandbox := fs.Bool("sandbox", false, "include the sandbox region: real redis-servers, nodes and coordinators (allot-sandbox, allot-load), 8 runs of 90 s (about 15 minutes)")
	jobs := fs.Int("j", runtime.GOMAXPROCS(0), "simulations run at once (runs whose cost is reported run alone)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	root, err := output("git", "rev-parse", "--show-toplevel")
	if err != nil {
		return err
	}
	if err := os.Chdir(root); err != nil {
		return err
	}
	b, err := os.ReadFile(*docPath)
	if err != nil {
		return err
	}
	doc := string(b)
	if *checkOnly {
		return check(doc, names())
	}
	if _, err := parse(doc); err != nil {
		return fmt.Errorf("%s: %w", *docPath, err)
	}

	var todo []section
	want := splitList(*only)
	for _, s := range sections {
		switch {
		case len(want) > 0 && !slices.Contains(want, s.name):
		case s.optIn == "big" && !*big, s.optIn == "sandbox" && !*sandbox:
			fmt.Fprintf(os.Stderr, "simdocs: %s kept as it is (-%s makes it)\n", s.name, s.optIn)
		default:
			todo = append(todo, s)
		}
	}
	for _, w := range want {
		if !slices.Contains(names(), w) {
			return fmt.Errorf("-only %s: no such region (%s)", w, strings.Join(names(), ", "))
		}
	}

	g := &gen{jobs: *jobs, cache: map[string]*result{}}
	if g.commit, err = commit(); err != nil {
		return err
	}
	if g.bin, err = os.MkdirTemp("", "simdocs-"); err != nil {
		return err
	}
	defer os.RemoveAll(g.bin)
	cmds := []string{"allot-sim"}
	if *sandbox {
		cmds = append(cmds, "allot-sandbox", "allot-load")
	}
	for _, c := range cmds {
		if _, err := output("go", "build", "-o", filepath.Join(g.bin, c), "./cmd/"+c); err != nil {
			return err
		}
	}
	start := time.Now()
	for _, s := range todo {
		t0, n0 := time.Now(), g.runs.Load()
		fmt.Fprintf(os.Stderr, "simdocs: %s...\n", s.name)
		body, err := s.make(g)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		if doc, err = replace(doc, s.name, body); err != nil {
			return err
		}
		// Written after each region: an interrupted regeneration keeps
		// what it made.
		if err := os.WriteFile(*docPath, []byte(doc), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "simdocs: %s: %d runs, %v\n", s.name, g.runs.Load()-n0, time.Since(t0).Round(time.Second))
	}
	fmt.Fprintf(os.Stderr, "simdocs: %d regions at %s in %v\n", len(todo), g.commit, time.Since(start).Round(time.Second))
	return check(doc, names())
}

// commit names the commit the figures are made at: HEAD, marked when
// the tree differs from it in a tracked file other than Markdown (no
// figure depends on a .md file; the doc itself changes as it is made).
func commit() (string, error) {
	c, err := output("git", "rev-parse", "--short=7", "HEAD")
	if err != nil {
		return "", err
	}
	dirty, err := output("git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude,glob)**/*.md")
	if err != nil {
		return "", err
	}
	if dirty != "" {
		fmt.Fprintf(os.Stderr, "simdocs: the tree differs from %s; the regions will say so:\n%s\n", c, dirty)
		return c + " with uncommitted changes", nil
	}
	return c, nil
}

func output(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}
