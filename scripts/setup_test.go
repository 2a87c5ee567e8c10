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

// Fakes of what a fresh Debian root gets from apt-get, logging each call
// with its working directory to $FAKE_LOG. The PostgreSQL tools appear
// once apt-get installs postgresql; the cluster is a state file.
var fakeTools = map[string]string{
	"id": `[ "$1" = -u ] && echo 0 || exec /usr/bin/id "$@"`,
	"apt-get": `echo "apt-get $* DEBIAN_FRONTEND=${DEBIAN_FRONTEND:-}" >>"$FAKE_LOG"
echo "debconf: delaying package configuration, since apt-utils is not installed" >&2
echo "Selecting previously unselected package fake."
if [ "$1" = install ]; then
  [ -n "${FAKE_APT_FAIL:-}" ] && { echo "E: Unable to locate package fake" >&2; exit 100; }
  case " $* " in *" postgresql "*) cp "$FAKE_PG"/* "$(dirname "$0")/";; esac
  case " $* " in *" gcc "*) printf '#!/bin/bash\n' >"$(dirname "$0")/gcc"; chmod +x "$(dirname "$0")/gcc";; esac
fi
exit 0`,
	"service":   `echo "service $* cwd=$PWD" >>"$FAKE_LOG"`,
	"systemctl": `echo "systemctl $* cwd=$PWD" >>"$FAKE_LOG"`,
}

var fakePGTools = map[string]string{
	"pg_lsclusters": `[ -f "$FAKE_STATE" ] && echo "$(cat "$FAKE_STATE") postgres /data /log"; exit 0`,
	"pg_createcluster": `echo "pg_createcluster $* cwd=$PWD" >>"$FAKE_LOG"
[ "$1" = -p ] && echo "$3 $4 $2 down" >"$FAKE_STATE"`,
	"pg_ctlcluster": `echo "pg_ctlcluster $* cwd=$PWD" >>"$FAKE_LOG"
read -r ver name port status <"$FAKE_STATE"
case "$3" in start) status=online;; stop) status=down;; esac
echo "$ver $name $port $status" >"$FAKE_STATE"`,
	"runuser": `echo "runuser $* cwd=$PWD" >>"$FAKE_LOG"
shift 3; exec "$@"`,
	"psql": `case "$*" in
*ALTER*) echo "psql $* cwd=$PWD" >>"$FAKE_LOG"; touch "$FAKE_STATE.password";;
*allot-test@*) grep -q online "$FAKE_STATE" 2>/dev/null && [ -f "$FAKE_STATE.password" ];;
*) exit 2;;
esac`,
}

// setupOnly runs test.sh's setup (ALLOT_TEST_SETUP_ONLY) on a fake fresh
// root: a PATH holding only fakes and the few tools the script uses, so
// nothing on this machine is installed, started or stopped.
//
// cluster, when set, is a PostgreSQL cluster running before the script
// ("VER NAME PORT online", with the script's password): its tools are
// installed from the start.
func setupOnly(t *testing.T, cluster string, env ...string) (out, log, state string, err error) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("the test command's setup is for Debian")
	}
	dir := t.TempDir()
	bin, pg := filepath.Join(dir, "bin"), filepath.Join(dir, "pg")
	require.NoError(t, os.Mkdir(bin, 0o755))
	require.NoError(t, os.Mkdir(pg, 0o755))
	write := func(d string, tools map[string]string) {
		for name, body := range tools {
			require.NoError(t, os.WriteFile(filepath.Join(d, name), []byte("#!/bin/bash\n"+body+"\n"), 0o755))
		}
	}
	write(bin, fakeTools)
	write(pg, fakePGTools)
	log, state = filepath.Join(dir, "calls.log"), filepath.Join(dir, "cluster")
	if cluster != "" {
		write(bin, fakePGTools)
		require.NoError(t, os.WriteFile(state, []byte(cluster+"\n"), 0o644))
		require.NoError(t, os.WriteFile(state+".password", nil, 0o644))
	}
	goBin, err := exec.LookPath("go")
	require.NoError(t, err)
	for _, tool := range []string{"bash", "dirname", "mktemp", "rm", "cat", "grep", "awk", "sort", "tail", "ls", "cp", "touch", "chmod"} {
		p, err := exec.LookPath(tool)
		require.NoError(t, err)
		require.NoError(t, os.Symlink(p, filepath.Join(bin, tool)))
	}
	require.NoError(t, os.Symlink(goBin, filepath.Join(bin, "go")))
	cmd := exec.Command(filepath.Join(bin, "bash"), "test.sh")
	cmd.Env = append(os.Environ(), "PATH="+bin, "CC=gcc", "ALLOT_TEST_SETUP_ONLY=1", "ALLOT_TEST_PG_PORT=54329",
		"FAKE_LOG="+log, "FAKE_STATE="+state, "FAKE_PG="+pg, "TMPDIR="+dir)
	for i, kv := range cmd.Env {
		if strings.HasPrefix(kv, "ALLOT_TEST_POSTGRES=") {
			cmd.Env[i] = "ALLOT_TEST_POSTGRES_UNSET=1"
		}
	}
	cmd.Env = append(cmd.Env, env...)
	b, err := cmd.CombinedOutput()
	calls, _ := os.ReadFile(log)
	st, _ := os.ReadFile(state)
	return string(b), string(calls), strings.TrimSpace(string(st)), err
}

// On a fresh root the test command installs quietly (apt's chatter and
// debconf's warnings stay in its log), runs PostgreSQL's tools from /
// (user postgres cannot enter a checkout under /root), and stops the
// cluster it started on the way out.
func TestTestCommandSetsUpQuietlyAndStopsWhatItStarted(t *testing.T) {
	if vers, _ := os.ReadDir("/usr/lib/postgresql"); len(vers) == 0 {
		// The script names a new cluster after the server version there.
		t.Skip("no PostgreSQL server under /usr/lib/postgresql")
	}
	out, calls, state, err := setupOnly(t, "")
	require.NoError(t, err, "%s\ncalls:\n%s", out, calls)
	assert.Equal(t, strings.Join([]string{
		"installing redis-server redis-tools gcc libc6-dev with apt-get",
		"installing postgresql with apt-get",
		"postgres: postgres://postgres:allot-test@127.0.0.1:54329/postgres?sslmode=disable",
	}, "\n")+"\n", out, "only what a reader acts on")
	assert.Equal(t, 1, strings.Count(calls, "apt-get update"), calls)
	for _, l := range strings.Split(strings.TrimSpace(calls), "\n") {
		switch {
		case strings.HasPrefix(l, "apt-get"):
			assert.Contains(t, l, "-qq", l)
			assert.Contains(t, l, "DEBIAN_FRONTEND=noninteractive", l)
		default:
			assert.Contains(t, l, "cwd=/", l)
			assert.NotRegexp(t, `cwd=/.`, l)
		}
	}
	assert.Contains(t, calls, "pg_ctlcluster")
	assert.Contains(t, calls, "start cwd=/")
	assert.Contains(t, calls, "stop cwd=/", "stopped on the way out")
	assert.Regexp(t, ` 54329 down$`, state)
}

// A failing install shows apt's log, then stops.
func TestTestCommandShowsAptsLogOnFailure(t *testing.T) {
	out, _, _, err := setupOnly(t, "", "FAKE_APT_FAIL=1")
	require.Error(t, err)
	assert.Contains(t, out, "apt-get install redis-server redis-tools gcc libc6-dev failed")
	assert.Contains(t, out, "E: Unable to locate package fake")
}

// A cluster that was running before is used and left running.
func TestTestCommandLeavesARunningClusterRunning(t *testing.T) {
	out, calls, st, err := setupOnly(t, "15 main 54329 online")
	require.NoError(t, err, "%s\ncalls:\n%s", out, calls)
	assert.Contains(t, out, "postgres: postgres://postgres:allot-test@127.0.0.1:54329/postgres")
	assert.NotContains(t, calls, "stop")
	assert.NotContains(t, calls, "ALTER", "no new password on a server it did not start")
	assert.Equal(t, "15 main 54329 online", st)
}
