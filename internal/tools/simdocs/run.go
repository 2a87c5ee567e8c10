package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/allot-dev/allot/internal/tools/sim"
)

// result is what one allot-sim run printed on its last line (the JSON,
// read into sim.Result), and what the run cost.
type result struct {
	sim.Result

	// fields is every field of the JSON line, in its order, with its
	// value as printed.
	fields []field
	// What the run cost: wall time, user CPU, peak RSS (bytes).
	wall, user time.Duration
	maxRSS     int64
}

type field struct {
	name  string
	value json.RawMessage
}

// iv returns the i-th interval's % of L (before the shift, 1st and 2nd
// after, after 2 intervals).
func (r *result) iv(i int) float64 {
	if i >= len(r.Intervals) {
		return 0
	}
	return 100 * r.Intervals[i].OfL
}

// parseResult reads the JSON line, the last of out.
func parseResult(out []byte) (*result, error) {
	out = bytes.TrimSpace(out)
	last := out[bytes.LastIndexByte(out, '\n')+1:]
	r := &result{}
	if err := json.Unmarshal(last, r); err != nil {
		return nil, fmt.Errorf("the last line is not allot-sim's JSON: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(last))
	if _, err := dec.Token(); err != nil { // {
		return nil, err
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		name := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		r.fields = append(r.fields, field{name, v})
	}
	return r, nil
}

// sim runs allot-sim with args, or returns the result of the same args
// run before.
func (g *gen) sim(args []string) (*result, error) {
	key := strings.Join(args, "\x00")
	g.mu.Lock()
	if r, ok := g.cache[key]; ok {
		g.mu.Unlock()
		return r, nil
	}
	g.mu.Unlock()
	out, wall, ru, err := g.exec(filepath.Join(g.bin, "allot-sim"), args...)
	if err != nil {
		return nil, fmt.Errorf("allot-sim %s: %w", shellJoin(args), err)
	}
	r, err := parseResult(out)
	if err != nil {
		return nil, fmt.Errorf("allot-sim %s: %w", shellJoin(args), err)
	}
	r.wall = wall
	if ru != nil {
		r.user = time.Duration(ru.Utime.Nano())
		r.maxRSS = ru.Maxrss << 10 // Linux: kilobytes
	}
	g.runs.Add(1)
	g.mu.Lock()
	g.cache[key] = r
	g.mu.Unlock()
	return r, nil
}

// sims runs every args of runs, g.jobs at once, and returns their
// results in the same order.
func (g *gen) sims(runs [][]string) ([]*result, error) {
	out := make([]*result, len(runs))
	errs := make([]error, len(runs))
	next := make(chan int)
	var wg sync.WaitGroup
	for range max(g.jobs, 1) {
		wg.Go(func() {
			for i := range next {
				out[i], errs[i] = g.sim(runs[i])
			}
		})
	}
	for i := range runs {
		next <- i
	}
	close(next)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// exec runs name with args in the repository's root and returns its
// stdout, how long it took and its resource use; stderr goes to ours
// when it fails.
func (g *gen) exec(name string, args ...string) ([]byte, time.Duration, *syscall.Rusage, error) {
	cmd := exec.Command(name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	wall := time.Since(start)
	var ru *syscall.Rusage
	if cmd.ProcessState != nil {
		ru, _ = cmd.ProcessState.SysUsage().(*syscall.Rusage)
	}
	if err != nil {
		os.Stderr.Write(stderr.Bytes())
		return nil, wall, ru, err
	}
	return stdout.Bytes(), wall, ru, nil
}

// testEvent is one line of go test -json.
type testEvent struct {
	Action string
	Test   string
	Output string
}

// goTest runs go test with args (-json is added) and returns the tests
// in the order they started, and per test its output lines and its
// outcome (pass, fail or skip). A failing test is an error: the doc is
// not made from a failing build.
func (g *gen) goTest(args ...string) (tests []string, outputs map[string][]string, outcomes map[string]string, err error) {
	out, _, _, err := g.exec("go", append([]string{"test", "-json"}, args...)...)
	outputs, outcomes = map[string][]string{}, map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	var failed []string
	for sc.Scan() {
		var e testEvent
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Test == "" {
			continue
		}
		switch e.Action {
		case "run":
			tests = append(tests, e.Test)
		case "output":
			outputs[e.Test] = append(outputs[e.Test], strings.TrimRight(e.Output, "\n"))
		case "pass", "skip":
			outcomes[e.Test] = e.Action
		case "fail":
			outcomes[e.Test] = e.Action
			failed = append(failed, e.Test)
		}
	}
	if err != nil || len(failed) > 0 {
		for _, t := range failed {
			fmt.Fprintf(os.Stderr, "--- FAIL: %s\n%s\n", t, strings.Join(outputs[t], "\n"))
		}
		return nil, nil, nil, fmt.Errorf("go test %s: failed %v: %v", shellJoin(args), failed, err)
	}
	return tests, outputs, outcomes, nil
}

// shellJoin quotes what a shell would read otherwise.
func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}

func shellQuote(a string) string {
	if a == "" {
		return "''"
	}
	for _, c := range a {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-_./=,:@%+", c)) {
			return "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return a
}
