package docs_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// A comment that names a .go or .lua file names one that exists: with a
// slash, as a path from the repository root or from the comment's own
// folder; a bare .go name as a file of the comment's own folder, a bare
// .lua name as one of lua/. Files
// get deleted and renamed; the comments that send a reader to them must
// follow.
func TestCommentsCiteFilesThatExist(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	files, names := repoFiles(t, root)
	var cited int
	for _, f := range files {
		for _, c := range citesIn(t, root, f) {
			cited++
			if !exists(files, names, path.Dir(f), c.name) {
				t.Errorf("%s:%d: a comment cites %s, which does not exist", f, c.line, c.name)
			}
		}
	}
	if cited < 50 {
		t.Fatalf("found only %d citations: the scan is broken", cited)
	}
}

// The matcher itself: what counts as a citation, and what is left alone.
func TestCitationPattern(t *testing.T) {
	got := citePattern.FindAllString("see lua/common.lua and shard.go (check_tb.lua) x.go/y.go; not *.go, x.golang, or go.mod", -1)
	want := []string{"lua/common.lua", "shard.go", "check_tb.lua", "x.go", "y.go"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("got %q, want %q", got, want)
	}
}

var citePattern = regexp.MustCompile(`(?:[A-Za-z0-9_-]+/)*[A-Za-z0-9_-]+\.(?:go|lua)\b`)

type cite struct {
	name string
	line int
}

// repoFiles lists the repository's .go and .lua files (slash paths from
// root) and the set of their base names, skipping hidden folders and
// generated protobuf code.
func repoFiles(t *testing.T, root string) (files []string, names map[string]bool) {
	t.Helper()
	names = map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, ".lua") {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		files = append(files, filepath.ToSlash(rel))
		names[d.Name()] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files, names
}

// citesIn returns the file names the comments of f cite.
func citesIn(t *testing.T, root, f string) []cite {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f)))
	if err != nil {
		t.Fatal(err)
	}
	var out []cite
	add := func(text string, line int) {
		for i, l := range strings.Split(text, "\n") {
			for _, m := range citePattern.FindAllString(l, -1) {
				out = append(out, cite{m, line + i})
			}
		}
	}
	if strings.HasSuffix(f, ".lua") {
		for i, l := range strings.Split(string(src), "\n") {
			if _, c, ok := strings.Cut(l, "--"); ok {
				add(c, i+1)
			}
		}
		return out
	}
	if strings.HasSuffix(f, ".pb.go") {
		return nil // generated
	}
	fset := token.NewFileSet()
	af, err := parser.ParseFile(fset, f, src, parser.ParseComments)
	if err != nil {
		t.Fatalf("%s: %v", f, err)
	}
	for _, g := range af.Comments {
		add(g.Text(), fset.Position(g.Pos()).Line)
	}
	return out
}

func exists(files []string, names map[string]bool, dir, name string) bool {
	if !strings.Contains(name, "/") {
		// A bare Go file is one of the citing package's; a bare script is
		// one of package lua's.
		if strings.HasSuffix(name, ".lua") {
			return slices.Contains(files, "lua/"+name)
		}
		return slices.Contains(files, path.Join(dir, name))
	}
	name = strings.TrimPrefix(name, "./")
	for _, p := range []string{name, path.Join(dir, name)} {
		for _, f := range files {
			if f == p || strings.HasSuffix(f, "/"+p) {
				return true
			}
		}
	}
	return false
}
