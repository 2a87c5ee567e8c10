// Package scripts_test checks the test command's own logic.
package scripts_test

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// plan runs test.sh in plan-only mode with env added.
func plan(t *testing.T, env ...string) string {
	t.Helper()
	cmd := exec.Command("bash", "test.sh")
	cmd.Env = append(os.Environ(), append([]string{"ALLOT_TEST_PLAN_ONLY=1"}, env...)...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return string(out)
}

// On a machine without a C compiler (CC names none), the test command
// installs gcc with redis-server's installer, since -race needs cgo; and
// until one is there it says the tests would run without -race.
func TestTestCommandInstallsACompiler(t *testing.T) {
	out := plan(t, "CC=/nonexistent/allot-cc")
	assert.Contains(t, out, "gcc libc6-dev")
	assert.Contains(t, out, "race: off until a C compiler is installed")
}

// With a compiler present it installs none and runs -race.
func TestTestCommandKeepsAPresentCompiler(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc here")
	}
	out := plan(t, "CC=gcc")
	assert.NotContains(t, out, "gcc")
	assert.Contains(t, out, "race: on")
}
