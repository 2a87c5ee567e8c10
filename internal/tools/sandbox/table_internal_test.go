package sandbox

import (
	"os"
	"path/filepath"
	"testing"
)

// The table names the policy file relative to the working directory, not
// by a path of the machine it ran on.
func TestDisplayPathIsRelativeUnderTheWorkingDirectory(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if got := displayPath(filepath.Join(wd, "examples", "p.yaml")); got != filepath.Join("examples", "p.yaml") {
		t.Errorf("under the working directory: %q", got)
	}
	if got := displayPath("/elsewhere/p.yaml"); got != "/elsewhere/p.yaml" {
		t.Errorf("outside it: %q", got)
	}
}
