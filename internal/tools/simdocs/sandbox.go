package main

import (
	"bufio"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The sandbox replay: the scenario of allot-sim's shift on real
// processes, 2 and 8 nodes per region, the shift landing at several
// phases past an epoch boundary, each next to allot-sim's seeds 1-5.
var sandboxRuns = []struct {
	nodes int
	phase time.Duration
}{
	{2, 0}, {2, 3 * time.Second}, {2, 5 * time.Second}, {2, 7 * time.Second}, {2, 9 * time.Second},
	{8, 0}, {8, 7 * time.Second}, {8, 9 * time.Second},
}

const sandboxInterval = 10 * time.Second

// loadArgs is allot-load's run against targets, writing its series to
// csvPath.
func loadArgs(targets, csvPath string) []string {
	return []string{"--target", targets, "--key-field", "client", "--keys", "hot", "--key-prefix", "shift-",
		"--rate", "1500", "--duration", "90s", "--shift-at", "30s", "--shift-split", "us=0.9,eu=0.05,ap=0.05", "--ideal-rate", "300",
		"--csv", csvPath, "--quiet"}
}

// sandboxSim is allot-sim's replay of a sandbox run, but its seed.
func sandboxSim(nodes, phase string) []string {
	return append(shiftBase(nodes, "90s"), "--phase", phase)
}

// The intervals of the sandbox table, as allot-sim's: before the shift,
// the 1st and 2nd after it, then to the end.
var sandboxSpans = [][2]int{{20, 30}, {30, 40}, {40, 50}, {50, 90}}

func (g *gen) sandbox() (string, error) {
	dir, err := os.MkdirTemp("", "simdocs-sandbox-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	base, err := os.ReadFile("examples/sandbox-policies.yaml")
	if err != nil {
		return "", err
	}
	policies := filepath.Join(dir, "policies.yaml")
	if err := os.WriteFile(policies, append(base, "\nrebalance: {interval: 10s}\n"...), 0o644); err != nil {
		return "", err
	}
	var sims [][]string
	for _, s := range sandboxRuns {
		sims = append(sims, seeds(sandboxSim(strconv.Itoa(s.nodes), fmt.Sprintf("%ds", int(s.phase.Seconds()))), nil, 5)...)
	}
	rs, err := g.sims(sims)
	if err != nil {
		return "", err
	}
	t := table{head: []string{"nodes per region, phase", "run", "before the shift", "1st interval after", "2nd interval", "after 2 intervals"}}
	var gap float64
	ok2nd := 0
	for i, s := range sandboxRuns {
		fmt.Fprintf(os.Stderr, "simdocs: sandbox, %d nodes per region, phase %v...\n", s.nodes, s.phase)
		got, err := g.sandboxRun(dir, policies, s.nodes, s.phase)
		if err != nil {
			return "", err
		}
		sim := rs[5*i : 5*i+5]
		cells := []string{fmt.Sprintf("%d, %d s", s.nodes, int(s.phase.Seconds())), "sandbox"}
		for _, x := range got {
			cells = append(cells, num(x, 1)+" %")
		}
		t.add(cells...)
		cells = []string{"", "sim, seeds 1-5: mean (range)"}
		for j := range sandboxSpans {
			var xs []float64
			for _, r := range sim {
				xs = append(xs, r.iv(j))
			}
			if j == 0 {
				cells = append(cells, num(mean(xs), 1))
			} else {
				cells = append(cells, spread(xs))
			}
			gap = math.Max(gap, math.Abs(got[j]-mean(xs)))
		}
		t.add(cells...)
		if got[2] >= 95 {
			ok2nd++
		}
	}
	sum := fmt.Sprintf("\nThe sandbox is within %s points of L of the simulation's mean in every interval; its 2nd interval is at least 95 %% of L in %d of the %d runs.\n",
		num(gap, 1), ok2nd, len(sandboxRuns))
	return g.header("sandbox") + sh(
		"# each pair of rows: N nodes per region, the load started P s past a multiple of 10 s of wall time",
		"# (policies.yaml: examples/sandbox-policies.yaml plus `rebalance: {interval: 10s}`;",
		"#  TARGETS: every node, as allot-sandbox prints them)",
		"allot-sandbox --policies policies.yaml --nodes N",
		"allot-load "+shellJoin(loadArgs("TARGETS", "run.csv")),
		"for seed in 1 2 3 4 5; do",
		"  allot-sim "+shellJoin(sandboxSim("N", "Ps"))+" --seed $seed",
		"done") + t.String() + sum, nil
}

// sandboxRun starts allot-sandbox, waits for the phase, runs allot-load
// and stops the sandbox; it returns the % of L admitted over each of
// sandboxSpans.
func (g *gen) sandboxRun(dir, policies string, nodes int, phase time.Duration) ([]float64, error) {
	sb := exec.Command(filepath.Join(g.bin, "allot-sandbox"), "--policies", policies, "--nodes", strconv.Itoa(nodes))
	sb.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	sb.Stderr = os.Stderr
	out, err := sb.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := sb.Start(); err != nil {
		return nil, err
	}
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		_ = sb.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- sb.Wait() }()
		select {
		case err := <-done:
			return err
		case <-time.After(time.Minute):
			_ = syscall.Kill(-sb.Process.Pid, syscall.SIGKILL)
			return errors.New("allot-sandbox did not stop within a minute: killed")
		}
	}
	defer stop()

	var targets string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		l := sc.Text()
		if _, rest, ok := strings.Cut(l, "--target "); ok && targets == "" {
			targets = strings.Fields(rest)[0]
		}
		if strings.HasPrefix(l, "Ctrl-C stops the sandbox") {
			break
		}
	}
	if targets == "" {
		return nil, errors.New("allot-sandbox printed no --target")
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()

	// Start the load phase past a multiple of the interval of wall time
	// (the epochs are aligned on it), at least a second from now.
	now := time.Now()
	at := now.Truncate(sandboxInterval).Add(phase)
	for at.Before(now.Add(time.Second)) {
		at = at.Add(sandboxInterval)
	}
	time.Sleep(time.Until(at))
	csvPath := filepath.Join(dir, fmt.Sprintf("n%d-p%d.csv", nodes, int(phase.Seconds())))
	if _, _, _, err := g.exec(filepath.Join(g.bin, "allot-load"), loadArgs(targets, csvPath)...); err != nil {
		return nil, fmt.Errorf("allot-load: %w", err)
	}
	if err := stop(); err != nil {
		return nil, fmt.Errorf("allot-sandbox: %w", err)
	}
	return admittedOfL(csvPath, 300)
}

// admittedOfL reads allot-load's CSV and returns, for each of
// sandboxSpans, the % of limit per second admitted.
func admittedOfL(path string, limit float64) ([]float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil || len(recs) < 2 {
		return nil, fmt.Errorf("%s: %v, %d lines", path, err, len(recs))
	}
	ti, ai := slices.Index(recs[0], "t_seconds"), slices.Index(recs[0], "admitted")
	if ti < 0 || ai < 0 {
		return nil, fmt.Errorf("%s: no t_seconds or admitted column", path)
	}
	sums := make([]float64, len(sandboxSpans))
	for _, rec := range recs[1:] {
		t, err1 := strconv.ParseFloat(rec[ti], 64)
		a, err2 := strconv.ParseFloat(rec[ai], 64)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		for i, s := range sandboxSpans {
			if t >= float64(s[0]) && t < float64(s[1]) {
				sums[i] += a
			}
		}
	}
	for i, s := range sandboxSpans {
		sums[i] = 100 * sums[i] / (limit * float64(s[1]-s[0]))
	}
	return sums, nil
}
