package docs_test

// The Go snippets of README.md, ARCHITECTURE.md and docs/*.md compile from
// a module outside this one (issue 37): a reader who copies one into their
// own module gets a program that builds, with public packages only (Go
// refuses a github.com/allot-dev/allot/internal/... import from outside).
//
// TestSnippetsCompile extracts every ```go (or ~~~go) fenced block, writes
// each into a directory of its own in one temporary module
//
//	module example.com/snippets
//	require github.com/allot-dev/allot v0.0.0 (+ this module's requirements)
//	replace github.com/allot-dev/allot => <repo root>
//
// with this module's go.sum, and builds them all with one `go build`
// (GOPROXY=off: everything comes from the module cache this module's own
// build filled). Each block is a subtest named file:line; a failing one
// shows the compiler's errors with positions in the Markdown file. A block
// must be a whole Go file (package clause first): anything else belongs in
// another fence (```text, ```sh, ...).

import (
	"encoding/json"
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// snippetBlock is one fenced Go block of a Markdown file.
type snippetBlock struct {
	file   string // slash path relative to the repo root
	line   int    // 1-based line of the opening fence
	indent int    // leading spaces removed from each line (fence in a list item)
	src    string
}

func (b snippetBlock) name() string { return b.file + ":" + strconv.Itoa(b.line) }

// snippetExtract returns the fenced blocks of md whose info string names
// Go ("go" or "golang", any case), each line without the fence's
// indentation (a fence in a list item), as CommonMark reads it.
func snippetExtract(file string, md []byte) []snippetBlock {
	lines := strings.Split(string(md), "\n")
	var out []snippetBlock
	for _, f := range fences(lines) {
		info := strings.Fields(f.info)
		if len(info) == 0 || !(strings.EqualFold(info[0], "go") || strings.EqualFold(info[0], "golang")) {
			continue
		}
		body := make([]string, 0, f.close-f.open)
		for _, line := range lines[f.open+1 : f.close] {
			line = strings.TrimSuffix(line, "\r")
			k := 0
			for k < f.indent && k < len(line) && line[k] == ' ' {
				k++
			}
			body = append(body, line[k:])
		}
		out = append(out, snippetBlock{file: file, line: f.open + 1, indent: f.indent, src: strings.Join(body, "\n") + "\n"})
	}
	return out
}

// snippetComplete reports whether src starts, after comments, with a
// package clause.
func snippetComplete(src string) bool {
	_, err := parser.ParseFile(token.NewFileSet(), "snippet.go", src, parser.PackageClauseOnly)
	return err == nil
}

func TestSnippetsCompile(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	snippetTrackInputs(t, root)

	files := documents(t, root)
	var blocks []snippetBlock
	for _, f := range files {
		md, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f)))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, snippetExtract(f, md)...)
	}
	if len(blocks) == 0 {
		t.Log("no ```go blocks")
		return
	}

	// One module, one directory (package) per complete block.
	mod := t.TempDir()
	if err := os.WriteFile(filepath.Join(mod, "go.mod"), snippetGoMod(t, gobin, root), 0o644); err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mod, "go.sum"), sum, 0o644); err != nil {
		t.Fatal(err)
	}
	dirs := map[string]int{} // directory -> index in blocks
	var pkgs []string
	for i, b := range blocks {
		if !snippetComplete(b.src) {
			continue
		}
		dir := fmt.Sprintf("allotsnippet%03d", i)
		if err := os.Mkdir(filepath.Join(mod, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(mod, dir, "snippet.go"), []byte(b.src), 0o644); err != nil {
			t.Fatal(err)
		}
		dirs[dir] = i
		pkgs = append(pkgs, "./"+dir)
	}
	failed := snippetBuild(t, gobin, mod, pkgs, blocks, dirs)

	for i, b := range blocks {
		t.Run(b.name(), func(t *testing.T) {
			var msg string
			switch {
			case !snippetComplete(b.src):
				msg = "not a complete Go file: a ```go block must start with a package clause " +
					"(a whole program or package a reader can copy, using public packages only); " +
					"make it complete, or put it in another fence (```text, ```sh, ...)"
			case failed[i] != "":
				msg = "does not compile from a module outside github.com/allot-dev/allot " +
					"(public packages only; internal/... cannot be imported):\n" + failed[i]
				if strings.Contains(failed[i], "GOPROXY=off") {
					msg += "\n(the build is offline: a snippet may import the standard library, " +
						"this module's public packages and the modules this module requires)"
				}
			default:
				return
			}
			t.Errorf("%s: %s", b.name(), msg)
		})
	}
}

// snippetGoMod returns the test module's go.mod: this module replaced by
// its directory, and this module's requirements, so that the build list
// is this module's and its go.sum covers it.
func snippetGoMod(t *testing.T, gobin, root string) []byte {
	cmd := exec.Command(gobin, "mod", "edit", "-json")
	cmd.Dir = root
	cmd.Env = snippetEnv()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod edit -json: %v\n%s", err, snippetStderr(err))
	}
	var m struct {
		Module  struct{ Path string }
		Go      string
		Require []struct{ Path, Version string }
		Replace []struct {
			Old, New struct{ Path, Version string }
		}
	}
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "module example.com/snippets\n\ngo %s\n\nrequire %s v0.0.0\n\nrequire (\n", m.Go, m.Module.Path)
	for _, r := range m.Require {
		fmt.Fprintf(&b, "\t%s %s\n", r.Path, r.Version)
	}
	fmt.Fprintf(&b, ")\n\nreplace %s => %s\n", m.Module.Path, strconv.Quote(root))
	for _, r := range m.Replace {
		old, dst := r.Old.Path, r.New.Path
		if r.Old.Version != "" {
			old += " " + r.Old.Version
		}
		if r.New.Version != "" {
			dst += " " + r.New.Version
		} else if !filepath.IsAbs(dst) {
			dst = strconv.Quote(filepath.Join(root, dst))
		}
		fmt.Fprintf(&b, "replace %s => %s\n", old, dst)
	}
	return []byte(b.String())
}

// snippetEnv is the go command's environment: offline, this toolchain, no
// workspace, the usual module and build caches.
func snippetEnv() []string {
	return append(os.Environ(),
		"GOFLAGS=-mod=mod", "GOPROXY=off", "GOTOOLCHAIN=local", "GOWORK=off")
}

func snippetStderr(err error) []byte {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.Stderr
	}
	return nil
}

// snippetDirRef matches a snippet directory and, when present, a position
// in its file.
var snippetDirRef = regexp.MustCompile(`allotsnippet(\d{3})(?:/snippet\.go(?::(\d+)(?::(\d+))?)?)?`)

// snippetPkgLine matches the go command's heading lines that only name a
// snippet's package ("# example.com/snippets/allotsnippet001"): the
// subtest's name says which block it is.
var snippetPkgLine = regexp.MustCompile(`^(# |package )example\.com/snippets/allotsnippet\d{3}$`)

// snippetBuild builds pkgs in mod and returns, per block index, the go
// command's output about the blocks that failed, positions rewritten to
// the Markdown file's. When some packages do not load (an internal import,
// an unknown package) the go command builds none, so it builds again
// without the ones that failed until the rest build or none is left.
func snippetBuild(t *testing.T, gobin, mod string, pkgs []string, blocks []snippetBlock, dirs map[string]int) map[int]string {
	failed := map[int]string{}
	for len(pkgs) > 0 {
		cmd := exec.Command(gobin, append([]string{"build", "-o", os.DevNull}, pkgs...)...)
		cmd.Dir = mod
		cmd.Env = snippetEnv()
		out, err := cmd.CombinedOutput()
		if err == nil {
			return failed
		}
		var errs map[int][]string
		cur := -1
		for line := range strings.Lines(string(out)) {
			line = strings.TrimRight(line, "\n")
			if m := snippetDirRef.FindStringSubmatch(line); m != nil {
				if i, ok := dirs["allotsnippet"+m[1]]; ok {
					cur = i
				}
			}
			if cur < 0 || snippetPkgLine.MatchString(line) {
				continue
			}
			b := blocks[cur]
			line = snippetDirRef.ReplaceAllStringFunc(line, func(ref string) string {
				m := snippetDirRef.FindStringSubmatch(ref)
				if i, ok := dirs["allotsnippet"+m[1]]; !ok || i != cur || m[2] == "" {
					return ref
				}
				l, _ := strconv.Atoi(m[2])
				pos := b.file + ":" + strconv.Itoa(b.line+l)
				if m[3] != "" {
					c, _ := strconv.Atoi(m[3])
					pos += ":" + strconv.Itoa(c+b.indent)
				}
				return pos
			})
			if errs == nil {
				errs = map[int][]string{}
			}
			errs[cur] = append(errs[cur], line)
		}
		if len(errs) == 0 {
			t.Fatalf("go build failed, and its output names no snippet: %v\n%s", err, out)
		}
		n := len(pkgs)
		pkgs = slices.DeleteFunc(pkgs, func(p string) bool {
			_, bad := errs[dirs[strings.TrimPrefix(p, "./")]]
			return bad
		})
		if len(pkgs) == n {
			t.Fatalf("go build failed, and its output names no snippet it built: %v\n%s", err, out)
		}
		for i, lines := range errs {
			failed[i] = strings.Join(lines, "\n")
		}
	}
	return failed
}

// snippetTrackInputs stats every Go file and go.mod/go.sum of the repo, so
// that go test's result cache, which knows only the test binary and the
// files the test touched, reruns the test when a public API changes.
func snippetTrackInputs(t *testing.T, root string) {
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if (strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go")) || name == "go.mod" || name == "go.sum" {
			_, err := os.Stat(p)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestSnippetExtract(t *testing.T) {
	md := strings.Join([]string{
		"# Title",                 // 1
		"```go",                   // 2
		"package a",               // 3
		"```",                     // 4
		"```sh",                   // 5
		"go build ./...",          // 6
		"```",                     // 7
		"- item",                  // 8
		"",                        // 9
		"  ```go title=\"x.go\"",  // 10
		"  package b",             // 11
		"",                        // 12
		"    func f() {}",         // 13
		"  ```   ",                // 14
		"````Go",                  // 15
		"package c",               // 16
		"```",                     // 17 (shorter: not a close)
		"`````",                   // 18
		"~~~golang",               // 19
		"x := 1",                  // 20
		"~~~",                     // 21
		"```go``` is not a fence", // 22
		"```",                     // 23
		"```go",                   // 24 (inside a plain block)
		"```",                     // 25
		"~~~ go",                  // 26
		"package unclosed",        // 27
	}, "\n")
	got := snippetExtract("x.md", []byte(md))
	want := []snippetBlock{
		{file: "x.md", line: 2, src: "package a\n"},
		{file: "x.md", line: 10, indent: 2, src: "package b\n\n  func f() {}\n"},
		{file: "x.md", line: 15, src: "package c\n```\n"},
		{file: "x.md", line: 19, src: "x := 1\n"},
		{file: "x.md", line: 26, src: "package unclosed\n"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("snippetExtract:\n got %+v\nwant %+v", got, want)
	}
	for src, want := range map[string]bool{
		"package main\n": true,
		"// Command x.\n\n//go:build linux\n\npackage x\n": true,
		"/* c */ package x": true,
		"x := 1\n":          false,
		"import \"fmt\"\n":  false,
		"":                  false,
	} {
		if got := snippetComplete(src); got != want {
			t.Errorf("snippetComplete(%q) = %v, want %v", src, got, want)
		}
	}
}
