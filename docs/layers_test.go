package docs_test

import (
	"bufio"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// No package imports one above it in ARCHITECTURE.md's table of layers
// ("Components and layers"): each row's packages (its first 38
// columns) may import only the rows below them, or their own row. Test
// imports are not counted; the programs of internal/tools and the test
// support of internal/testenv are left out (they stand beside the
// product, not in its layers). A package the table does not place is
// left out too, and the test fails if that leaves too few to mean
// anything.
func TestNoPackageImportsALayerAbove(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	rows := layerRows(t, filepath.Join(root, "ARCHITECTURE.md"))
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const mod = "github.com/allot-dev/allot/"
	rank := func(pkg string) (int, bool) {
		pkg = strings.TrimPrefix(pkg, mod)
		best, row := "", -1
		for p, r := range rows {
			if (pkg == p || strings.HasPrefix(pkg, p+"/")) && len(p) > len(best) {
				best, row = p, r
			}
		}
		return row, row >= 0
	}
	placed := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := strings.TrimPrefix(f[0], mod)
		if strings.HasPrefix(pkg, "internal/tools") || strings.HasPrefix(pkg, "internal/testenv") {
			continue
		}
		r, ok := rank(f[0])
		if !ok {
			t.Logf("unplaced %s", pkg)
			continue
		}
		placed++
		for _, imp := range f[1:] {
			if !strings.HasPrefix(imp, mod) {
				continue
			}
			if ri, ok := rank(imp); ok && ri < r {
				t.Errorf("%s (row %d) imports %s (row %d), a layer above it", pkg, r, strings.TrimPrefix(imp, mod), ri)
			}
		}
	}
	if placed < 30 {
		t.Errorf("only %d packages placed in the table: is it still there?", placed)
	}
}

// layerRows reads the table of layers: each package path (without its
// trailing slash) and its row, 0 at the top. A name after a comma is in
// the folder of the name before it (internal/fallback/, membership/),
// across a line break too; a row that starts with spaces continues the
// row above.
func layerRows(t *testing.T, file string) map[string]int {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows := map[string]int{}
	sc := bufio.NewScanner(f)
	section, block, row := false, false, -1
	var folder string // of the last name read
	comma := false    // the last name read ended with a comma
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			section = line == "## Components and layers"
			continue
		case section && strings.HasPrefix(line, "```"):
			if block {
				return rows
			}
			block = true
			continue
		case !block:
			continue
		}
		col := line[:min(len(line), 38)]
		if !strings.HasPrefix(col, " ") {
			row++
		}
		for _, field := range strings.Fields(col) {
			name := strings.TrimSuffix(strings.TrimSuffix(field, ","), "/")
			if !strings.Contains(name, "/") && comma {
				name = folder + "/" + name
			}
			folder = path.Dir(name)
			comma = strings.HasSuffix(field, ",")
			rows[name] = row
		}
	}
	t.Fatal("no table of layers under \"## Components and layers\"")
	return nil
}
