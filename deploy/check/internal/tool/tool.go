// Package tool runs what the deploy checks need from outside the test
// process: Helm and promtool at pinned versions (go install PKG@VERSION,
// so neither enters a go.mod and `go test ./...` of the main module never
// builds them), and the repository's own allot-node and allot-coordinator,
// built from this checkout so the chart is checked against the flags the
// code declares today.
package tool

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Pinned tool versions (/work/.library/env/packages/go-partial.tsv lists
// both as fetched whole). Install keeps the built executable in the
// user's cache, so only the first run on a machine pays for the build.
const (
	Helm     = "helm.sh/helm/v3/cmd/helm@v3.22.0"
	Promtool = "github.com/prometheus/prometheus/cmd/promtool@v0.316.0"
)

// buildTags are the build tags a pinned tool is installed with.
// remove_all_sd (Prometheus 3.10 and later) leaves out every service
// discovery provider and with them the cloud and Kubernetes SDKs, which
// `promtool check rules` and `test rules` never use: with empty module
// and build caches the install took 3 min 39 s instead of 7 min 0 s
// (2026-12-01, two cores, nothing else running).
var buildTags = map[string]string{Promtool: "remove_all_sd"}

// Root is the repository root (this file is deploy/check/internal/tool).
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", "..", ".."))
}

// Path joins elems under the repository root.
func Path(elems ...string) string { return filepath.Join(append([]string{Root()}, elems...)...) }

// Run runs the pinned tool pkg@version (Helm, Promtool) with args in dir
// and returns its combined output; a failure returns the output in the
// error. The tool is installed once per test process into a directory of
// the user's cache named after the version (Install).
func Run(ctx context.Context, t testing.TB, dir, pkg string, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.CommandContext(ctx, Install(t, pkg), args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("%s %s: %w\n%s", pkg, strings.Join(args, " "), err, out.String())
	}
	return out.Bytes(), nil
}

var (
	installMu sync.Mutex
	installed = map[string]string{}
)

// Install runs `go install pkg@version` (with its buildTags) with GOBIN a
// cache directory of its own (one per pinned version and tags, under
// os.UserCacheDir) and returns the executable. go install links only
// when the installed binary is stale, so after the first build on a
// machine this costs about a second, and every later call of the tool
// runs the binary directly.
func Install(t testing.TB, pkg string) string {
	t.Helper()
	installMu.Lock()
	defer installMu.Unlock()
	if p, ok := installed[pkg]; ok {
		return p
	}
	path, version, ok := strings.Cut(pkg, "@")
	if !ok {
		t.Fatalf("tool %s: want PKG@VERSION", pkg)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	name := filepath.Base(path) + "-" + version
	args := []string{"install"}
	if tags := buildTags[pkg]; tags != "" {
		name += "-" + tags
		args = append(args, "-tags", tags)
	}
	gobin := filepath.Join(cache, "allot-deploy-check", name)
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Env = append(os.Environ(), "GOBIN="+gobin, "GOTOOLCHAIN=local", "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go install %s: %v\n%s", pkg, err, out)
	}
	installed[pkg] = filepath.Join(gobin, filepath.Base(path))
	return installed[pkg]
}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// Main runs a test package's tests and then removes the binaries Binaries
// built; call it from TestMain.
func Main(m interface{ Run() int }) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// Binaries builds allot-node and allot-coordinator from this checkout
// (once per test process) and returns the directory holding them.
func Binaries(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "allot-deploy-check-")
		if buildErr != nil {
			return
		}
		for _, c := range [][2]string{{"allot-node", "./cmd/node"}, {"allot-coordinator", "./cmd/coordinator"}} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(binDir, c[0]), c[1])
			cmd.Dir = Root()
			cmd.Env = append(os.Environ(), "GOTOOLCHAIN=local", "GOFLAGS=-buildvcs=false")
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build %s: %w\n%s", c[1], err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

var helpFlag = regexp.MustCompile(`^  -([a-z0-9][a-z0-9-]*)`)

// Flags returns the flag names binary (allot-node, allot-coordinator)
// lists in its --help, without dashes.
func Flags(t testing.TB, binary string) map[string]bool {
	t.Helper()
	dir := Binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// --help exits 1 after printing the usage ("flag: help requested").
	out, _ := exec.CommandContext(ctx, filepath.Join(dir, binary), "--help").CombinedOutput()
	flags := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if m := helpFlag.FindStringSubmatch(sc.Text()); m != nil {
			flags[m[1]] = true
		}
	}
	if len(flags) < 10 {
		t.Fatalf("%s --help listed %d flags:\n%s", binary, len(flags), out)
	}
	return flags
}

// listening matches the lines node and coordinator log when a listener
// is up: `msg="http serving" listener=http addr=A` (node HTTP and metrics
// listeners), `msg="node serving" grpc=A`, `msg="metrics serving" addr=A`
// (coordinator).
var listening = regexp.MustCompile(`msg="(\w+) serving"(?: listener=(\S+))?(?: addr=(\S+))?(?: grpc=(\S+))?`)

// Start runs binary with args and env added to the test's environment,
// waits until every listener named in want (http, metrics, grpc) has
// logged its address, and returns the addresses by name. The process is
// killed when the test ends (SIGKILL: a graceful stop would wait out the
// node's drain period).
func Start(t testing.TB, binary string, env, want []string, args ...string) map[string]string {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	found := make(chan map[string]string, 1)
	var log bytes.Buffer // written by the reader only until found is sent or closed
	go func() {
		defer close(found)
		addrs := map[string]string{}
		sc := bufio.NewScanner(io.TeeReader(stderr, &log))
		for sc.Scan() {
			m := listening.FindStringSubmatch(sc.Text())
			switch {
			case m == nil:
				continue
			case m[4] != "":
				addrs["grpc"] = m[4]
			case m[3] != "":
				name := m[2]
				if name == "" {
					name = m[1]
				}
				addrs[name] = m[3]
			}
			if !slices.ContainsFunc(want, func(w string) bool { return addrs[w] == "" }) {
				found <- addrs
				_, _ = io.Copy(io.Discard, stderr) // keep the pipe drained
				return
			}
		}
	}()
	select {
	case addrs, ok := <-found:
		if !ok {
			t.Fatalf("%s %s exited before listening:\n%s", filepath.Base(binary), strings.Join(args, " "), log.String())
		}
		return addrs
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not listen in 30s", filepath.Base(binary))
	}
	return nil
}
