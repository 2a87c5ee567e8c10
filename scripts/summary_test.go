package scripts_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// What go test printed in a run with a failing test, a build failure, a
// timeout and passing packages around them.
const failedRun = `ok  	github.com/allot-dev/allot/algorithm	1.2s
--- FAIL: TestSweepRunsRealProcesses (31.10s)
    sweep_test.go:92: no-op /uniform/: sent 0, 0/s, p50 0s p99 0s
FAIL
FAIL	github.com/allot-dev/allot/internal/tools/loadgen/sweep	31.4s
?   	github.com/allot-dev/allot/cmd/allotctl	[no test files]
# github.com/allot-dev/allot/region [github.com/allot-dev/allot/region.test]
region/x_test.go:3:1: syntax error
FAIL	github.com/allot-dev/allot/region [build failed]
--- FAIL: TestOuter (0.10s)
    --- FAIL: TestOuter/inner (0.05s)
        outer_test.go:9: wrong
panic: test timed out after 10m0s
running tests:
	TestSlow (10m0s)

goroutine 7 [running]:
testing.(*M).startAlarm.func1()
	/usr/local/go/src/testing/testing.go:2500 +0x345
FAIL	github.com/allot-dev/allot/internal/node	600.2s
ok  	github.com/allot-dev/allot/lease	3.0s
FAIL
`

// A failing run's last lines name each failing test with its package,
// each failing package (build failures and timeouts said as such), the
// machine's load average on its CPUs, and the log's path.
func TestTestCommandSummarisesFailures(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the summary reads /proc/loadavg")
	}
	log := filepath.Join(t.TempDir(), "go-test.log")
	require.NoError(t, os.WriteFile(log, []byte(failedRun), 0o644))
	cmd := exec.Command("bash", "test.sh")
	cmd.Env = append(os.Environ(), "ALLOT_TEST_SUMMARY="+log)
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", b)
	out := string(b)
	assert.Contains(t, out, "failing tests:\n"+
		"  TestSweepRunsRealProcesses (31.10s)  [github.com/allot-dev/allot/internal/tools/loadgen/sweep]\n"+
		"  TestOuter (0.10s)  [github.com/allot-dev/allot/internal/node]\n"+
		"  TestOuter/inner (0.05s)  [github.com/allot-dev/allot/internal/node]\n"+
		"  TestSlow (still running at the timeout)  [github.com/allot-dev/allot/internal/node]\n")
	assert.Contains(t, out, "failing packages:\n"+
		"  github.com/allot-dev/allot/internal/tools/loadgen/sweep\n"+
		"  github.com/allot-dev/allot/region [build failed]\n"+
		"  github.com/allot-dev/allot/internal/node (timed out)\n")
	assert.NotContains(t, out, "algorithm")
	assert.NotContains(t, out, "lease")
	assert.Regexp(t, `load average [0-9.]+ [0-9.]+ [0-9.]+ on [0-9]+ CPUs: (not loaded|the machine was loaded)`, out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	assert.Equal(t, "full log: "+log, lines[len(lines)-1])
}
