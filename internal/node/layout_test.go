package node_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// decisionPath lists the packages a decision runs through. None of them
// may import a harness: harnesses start and break real processes, make
// certificates and fake clocks, and have no place in a node's binary.
var decisionPath = []string{
	"./internal/server", "./internal/node", "./internal/decide", "./region", "./lease",
	"./policy", "./algorithm", "./internal/fallback", "./internal/telemetry", "./internal/coord",
}

const module = "github.com/allot-dev/allot/"

// harnesses are the folders of test and tool harnesses.
var harnesses = []string{module + "internal/testenv/", module + "internal/tools/"}

func TestDecisionPathImportsNoHarness(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH")
	}
	cmd := exec.Command("go", append([]string{"list", "-deps", "-f", "{{.ImportPath}}"}, decisionPath...)...)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	require.NoError(t, err, "go list -deps")
	deps := strings.Fields(string(out))
	require.Contains(t, deps, module+"internal/decide", "go list read the decision path")
	for _, d := range deps {
		for _, h := range harnesses {
			assert.False(t, strings.HasPrefix(d, h), "the decision path imports the harness %s", d)
		}
	}
}

// TestInternalReadsAsTheProduct keeps `ls internal/` short enough to read
// as the product's parts: harnesses go under testenv/ or tools/.
func TestInternalReadsAsTheProduct(t *testing.T) {
	entries, err := os.ReadDir("..")
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	assert.LessOrEqual(t, len(names), 18, "internal/ holds %v", names)
	assert.Contains(t, names, "testenv")
	assert.Contains(t, names, "tools")
}
