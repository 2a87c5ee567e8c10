// Package docs_test checks the relative links of the project's Markdown:
// README.md, ARCHITECTURE.md and every docs/*.md. A link to a file that
// does not exist, or to an anchor that no heading of its target makes,
// fails the test (and so `make test`). Links with a scheme (http, https,
// mailto) are not followed.
package docs_test

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// The documents whose links are checked, relative to the repository root.
func documents(t *testing.T, root string) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md", "ARCHITECTURE.md"}
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, filepath.ToSlash(rel))
	}
	return files
}

func TestRelativeLinks(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	files := documents(t, root)
	if len(files) < 3 {
		t.Fatalf("found only %v", files)
	}
	for _, p := range newChecker(root).check(files) {
		t.Error(p)
	}
}

// The checker itself: every kind of broken link is reported, and nothing
// else.
func TestCheckerFindsBrokenLinks(t *testing.T) {
	root := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("README.md", "# Top\n\n## Run it (one command)\n\n## Run it (one command)\n\n"+
		"[ok](#run-it-one-command) [dup](#run-it-one-command-1) [file](docs/a.md) [dir](docs/)\n"+
		"[anchor](docs/a.md#the-stall-rule-t) [web](https://example.com/x.md#nope) [mail](mailto:a@b)\n"+
		"[code line](main.go#L3) ![img](docs/a.md)\n"+
		"`[in code](missing.md)` and\n```text\n[in a fence](missing.md)\n```\n"+
		"[bad anchor](#run-it) [missing](docs/b.md) [bad far anchor](docs/a.md#stall-rule)\n"+
		"[wrapped\ntext](docs/a.md#nowhere) [ref]\n\n[ref]: nothere.md\n")
	write("docs/a.md", "# A\n\n### The stall rule: `T`\n\n[up](../README.md#top) [out](../../x.md) [go](../main.go#x)\n")
	write("main.go", "package main\n")
	got := newChecker(root).check([]string{"README.md", "docs/a.md"})
	want := []string{
		`README.md:14: [bad anchor](#run-it): no heading of README.md has anchor "run-it"`,
		`README.md:14: [missing](docs/b.md): docs/b.md does not exist`,
		`README.md:14: [bad far anchor](docs/a.md#stall-rule): no heading of docs/a.md has anchor "stall-rule"`,
		`README.md:15: [wrapped text](docs/a.md#nowhere): no heading of docs/a.md has anchor "nowhere"`,
		`README.md:18: [ref](nothere.md): nothere.md does not exist`,
		`docs/a.md:5: [out](../../x.md): ../x.md is outside the repository`,
		`docs/a.md:5: [go](../main.go#x): main.go is not Markdown: anchor "x" cannot be checked`,
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"Stalls, the breaker and shedding (`region/stall.go`, `region/breaker.go`)": "stalls-the-breaker-and-shedding-regionstallgo-regionbreakergo",
		"Leasing (`precision: leased`)":                                             "leasing-precision-leased",
		"Global quotas (daily, monthly: `fixed_window` with `scope: global`)":       "global-quotas-daily-monthly-fixed_window-with-scope-global",
		"Run it (one command)":                                                      "run-it-one-command",
		"Batch and Take":                                                            "batch-and-take",
		"**Bold** and [a link](x.md) — dash":                                        "bold-and-a-link--dash",
		"Theorem 1: the shares in force never sum to more than `L`":                 "theorem-1-the-shares-in-force-never-sum-to-more-than-l",
		"Slack of the region total: `b + r·T + (k/N)·b`":                            "slack-of-the-region-total-b--rt--knb",
	} {
		if got := slug(heading); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}
}

// checker reads documents under root once each and checks their links.
type checker struct {
	root    string
	anchors map[string]map[string]bool // document (slash path) -> anchors
}

func newChecker(root string) *checker {
	return &checker{root: root, anchors: map[string]map[string]bool{}}
}

// check returns one line per broken link of files (slash paths relative
// to the root), as file:line: [text](target): why.
func (c *checker) check(files []string) []string {
	var problems []string
	for _, f := range files {
		text, err := os.ReadFile(filepath.Join(c.root, filepath.FromSlash(f)))
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", f, err))
			continue
		}
		for _, l := range links(string(text)) {
			if why := c.broken(f, l.target); why != "" {
				problems = append(problems, fmt.Sprintf("%s:%d: [%s](%s): %s", f, l.line, l.text, l.target, why))
			}
		}
	}
	return problems
}

// broken says what is wrong with target, linked from document from, or "".
func (c *checker) broken(from, target string) string {
	if u, err := url.Parse(target); err == nil && u.Scheme != "" {
		switch strings.ToLower(u.Scheme) {
		case "http", "https", "mailto":
			return ""
		}
	}
	pathPart, anchor, _ := strings.Cut(target, "#")
	p, err := url.PathUnescape(pathPart)
	if err != nil {
		return fmt.Sprintf("bad path: %v", err)
	}
	if a, err := url.PathUnescape(anchor); err == nil {
		anchor = a
	}
	doc := from
	if p != "" {
		if strings.HasPrefix(p, "/") {
			return "absolute path: write it relative to " + from
		}
		doc = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(from), p)))
		if doc == ".." || strings.HasPrefix(doc, "../") {
			return doc + " is outside the repository"
		}
		if _, err := os.Stat(filepath.Join(c.root, filepath.FromSlash(doc))); err != nil {
			return doc + " does not exist"
		}
	}
	if anchor == "" {
		return ""
	}
	if !strings.HasSuffix(strings.ToLower(doc), ".md") {
		if lineAnchor.MatchString(anchor) {
			return "" // GitHub's line anchors of a source file
		}
		return fmt.Sprintf("%s is not Markdown: anchor %q cannot be checked", doc, anchor)
	}
	anchors, err := c.anchorsOf(doc)
	if err != nil {
		return err.Error()
	}
	if !anchors[anchor] {
		return fmt.Sprintf("no heading of %s has anchor %q", doc, anchor)
	}
	return ""
}

var lineAnchor = regexp.MustCompile(`^L\d+(-L\d+)?$`)

func (c *checker) anchorsOf(doc string) (map[string]bool, error) {
	if a, ok := c.anchors[doc]; ok {
		return a, nil
	}
	text, err := os.ReadFile(filepath.Join(c.root, filepath.FromSlash(doc)))
	if err != nil {
		return nil, err
	}
	a := anchors(string(text))
	c.anchors[doc] = a
	return a, nil
}

var (
	atxHeading = regexp.MustCompile(`^ {0,3}#{1,6}(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$`)
	htmlAnchor = regexp.MustCompile(`<a\s+(?:[^>]*\s)?(?:id|name)="([^"]+)"`)
)

// anchors returns the anchors GitHub makes for a Markdown document: one per
// heading (its slug; a repeated slug gets -1, -2, ...), and the id or name
// of every HTML <a> element.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range strings.Split(blankFences(text), "\n") {
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
		m := atxHeading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		base := slug(m[1])
		s := base
		for n := seen[base]; ; n++ {
			if n > 0 {
				s = fmt.Sprintf("%s-%d", base, n)
			}
			if !out[s] {
				seen[base] = n + 1
				break
			}
		}
		out[s] = true
	}
	return out
}

var (
	inlineLink = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTag    = regexp.MustCompile(`<[^>]+>`)
)

// slug is GitHub's anchor for a heading: its text as rendered (link
// targets, HTML tags and code or emphasis marks dropped), lower case,
// every character but letters, digits, '-' and '_' dropped, and each space
// turned into '-'.
func slug(heading string) string {
	heading = inlineLink.ReplaceAllString(heading, "$1")
	heading = htmlTag.ReplaceAllString(heading, "")
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// link is one link of a document: its text, its target and the line where
// it starts.
type link struct {
	text, target string
	line         int
}

var (
	// [text](target) or [text](target "title"), images included; the
	// text may wrap onto the next lines.
	linkRe = regexp.MustCompile(`\[([^\]]*)\]\(\s*<?([^)\s>]*)>?(?:\s+(?:"[^"]*"|'[^']*'))?\s*\)`)
	// [label]: target, a reference definition.
	refDefRe = regexp.MustCompile(`(?m)^ {0,3}\[[^\]]+\]:[ \t]*<?([^\s>]+)>?`)
)

// links returns the links of a Markdown document, outside code blocks and
// code spans.
func links(text string) []link {
	text = blankCode(text)
	lineAt := func(off int) int { return 1 + strings.Count(text[:off], "\n") }
	var out []link
	for _, m := range linkRe.FindAllStringSubmatchIndex(text, -1) {
		out = append(out, link{
			text:   strings.Join(strings.Fields(text[m[2]:m[3]]), " "),
			target: text[m[4]:m[5]],
			line:   lineAt(m[0]),
		})
	}
	for _, m := range refDefRe.FindAllStringSubmatchIndex(text, -1) {
		label := text[m[0]:m[2]]
		label = strings.TrimSpace(label[strings.Index(label, "[")+1 : strings.Index(label, "]")])
		out = append(out, link{text: label, target: text[m[2]:m[3]], line: lineAt(m[0])})
	}
	return out
}

// blankCode replaces the content of fenced code blocks and code spans with
// spaces, keeping every newline, so that offsets and line numbers hold
// and nothing in code reads as a link.
func blankCode(text string) string { return blankSpans(blankFences(text)) }

// blank replaces b[from:to] with spaces, keeping newlines.
func blank(b []byte, from, to int) {
	for i := from; i < to; i++ {
		if b[i] != '\n' {
			b[i] = ' '
		}
	}
}

// blankFences blanks fenced code blocks, fences included.
func blankFences(text string) string {
	lines := strings.Split(text, "\n")
	start := make([]int, len(lines)+1) // byte offset of each line
	for i, l := range lines {
		start[i+1] = start[i] + len(l) + 1
	}
	b := []byte(text)
	for _, f := range fences(lines) {
		blank(b, start[f.open], min(start[min(f.close+1, len(lines))], len(b)))
	}
	return string(b)
}

// fence is one fenced code block of a Markdown document: the lines
// (0-based) of its opening and closing fence (close is the line count
// when it runs to the end), the opening fence's indentation and its info
// string.
type fence struct {
	open, close, indent int
	info                string
}

// fenceOpen matches an opening code fence: indentation, a run of three or
// more backticks or tildes, and the info string.
var fenceOpen = regexp.MustCompile("^( *)(`{3,}|~{3,})(.*)$")

// fences returns the fenced code blocks of a document's lines, as
// CommonMark reads them: a block ends at a line of the opening fence's
// character at least as long as it, or at the end of the document; an
// opening backtick fence's info string has no backtick.
func fences(lines []string) []fence {
	var out []fence
	mark := ""
	for i, line := range lines {
		line = strings.TrimSuffix(line, "\r")
		if mark == "" {
			m := fenceOpen.FindStringSubmatch(line)
			if m == nil || (m[2][0] == '`' && strings.Contains(m[3], "`")) {
				continue
			}
			mark = m[2]
			out = append(out, fence{open: i, close: len(lines), indent: len(m[1]), info: m[3]})
			continue
		}
		if t := strings.TrimSpace(line); len(t) >= len(mark) && strings.Trim(t, mark[:1]) == "" {
			out[len(out)-1].close = i
			mark = ""
		}
	}
	return out
}

// blankSpans blanks code spans: a run of n backticks up to the next run
// of exactly n.
func blankSpans(s string) string {
	b := []byte(s)
	for i := 0; i < len(s); {
		if s[i] != '`' {
			i++
			continue
		}
		n := 0
		for i+n < len(s) && s[i+n] == '`' {
			n++
		}
		end := -1
		for j := i + n; j < len(s); {
			if s[j] != '`' {
				j++
				continue
			}
			k := 0
			for j+k < len(s) && s[j+k] == '`' {
				k++
			}
			if k == n {
				end = j
				break
			}
			j += k
		}
		if end < 0 {
			i += n
			continue
		}
		blank(b, i, end+n)
		i = end + n
	}
	return string(b)
}
