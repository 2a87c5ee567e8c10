package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// A generated region of the doc is
//
//	<!-- simdocs:NAME begin -->
//	body: the commands run, in a fenced block, then their tables
//	<!-- simdocs:NAME end sha256=HASH -->
//
// HASH is the first 16 hex digits of the body's SHA-256: a hand edit
// inside a region no longer matches it, and check says so.
var marker = regexp.MustCompile(`^<!-- simdocs:([a-z0-9-]+) (begin|end)(?: sha256=([0-9a-f]{16}))? -->$`)

// region is one generated region of the doc: its lines [begin, end] are
// the markers, body the lines between them.
type region struct {
	name       string
	begin, end int // 0-based line numbers of the markers
	hash       string
	body       string // the lines between the markers, each with its "\n"
}

// parse finds the doc's regions in order and checks them: see check.
func parse(doc string) ([]region, error) {
	lines := strings.SplitAfter(doc, "\n")
	var out []region
	var errs []error
	open := -1 // index in out of the region begun and not yet ended
	fence := false
	for i, l := range lines {
		t := strings.TrimRight(l, "\n")
		if strings.HasPrefix(strings.TrimSpace(t), "```") {
			fence = !fence
		}
		if !strings.HasPrefix(t, "<!-- simdocs:") {
			if open < 0 && !fence && strings.HasPrefix(strings.TrimSpace(t), "|") {
				errs = append(errs, fmt.Errorf("line %d: a table outside the generated regions (every table here is generated)", i+1))
			}
			continue
		}
		m := marker.FindStringSubmatch(t)
		switch {
		case m == nil:
			errs = append(errs, fmt.Errorf("line %d: malformed marker %q", i+1, t))
		case m[2] == "begin":
			if open >= 0 {
				errs = append(errs, fmt.Errorf("line %d: region %s begins inside region %s", i+1, m[1], out[open].name))
				continue
			}
			out = append(out, region{name: m[1], begin: i, end: -1})
			open = len(out) - 1
		default:
			if open < 0 || out[open].name != m[1] {
				errs = append(errs, fmt.Errorf("line %d: region %s ends without its begin", i+1, m[1]))
				continue
			}
			r := &out[open]
			r.end, r.hash = i, m[3]
			r.body = strings.Join(lines[r.begin+1:i], "")
			open = -1
		}
	}
	if open >= 0 {
		errs = append(errs, fmt.Errorf("line %d: region %s never ends", out[open].begin+1, out[open].name))
	}
	return out, errors.Join(errs...)
}

// check reports what is wrong with the doc's regions: markers unpaired,
// nested or malformed; a name twice, unknown, or a known one missing; a
// body whose hash does not match (a hand edit); a body whose first table
// comes before a fenced block (its commands) or that has no table; a
// table outside every region.
func check(doc string, known []string) error {
	regions, err := parse(doc)
	errs := []error{err}
	seen := map[string]bool{}
	for _, r := range regions {
		if r.end < 0 {
			continue
		}
		if seen[r.name] {
			errs = append(errs, fmt.Errorf("line %d: region %s twice", r.begin+1, r.name))
		}
		seen[r.name] = true
		if !slices.Contains(known, r.name) {
			errs = append(errs, fmt.Errorf("line %d: region %s: no section of the generator makes it", r.begin+1, r.name))
		}
		if r.hash == "" {
			errs = append(errs, fmt.Errorf("line %d: region %s's end has no sha256", r.end+1, r.name))
		} else if h := hash(r.body); h != r.hash {
			errs = append(errs, fmt.Errorf("line %d: region %s was edited by hand (sha256 %s, the marker says %s): rerun the generator", r.end+1, r.name, h, r.hash))
		}
		if err := commandsFirst(r.body); err != nil {
			errs = append(errs, fmt.Errorf("region %s (line %d): %w", r.name, r.begin+1, err))
		}
	}
	for _, n := range known {
		if !seen[n] {
			errs = append(errs, fmt.Errorf("region %s is missing", n))
		}
	}
	return errors.Join(errs...)
}

// commandsFirst checks that body shows its commands (a fenced block)
// before its first table, and has a table.
func commandsFirst(body string) error {
	fenced, fence := false, false
	for l := range strings.Lines(body) {
		t := strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(t, "```"):
			fence = !fence
			fenced = true
		case !fence && strings.HasPrefix(t, "|"):
			if !fenced {
				return errors.New("a table before the commands that made it")
			}
			return nil
		}
	}
	return errors.New("no table")
}

func hash(body string) string {
	h := sha256.Sum256([]byte(body))
	return hex.EncodeToString(h[:8])
}

// replace returns doc with region name's body set to body (its end
// marker's hash with it).
func replace(doc, name, body string) (string, error) {
	regions, err := parse(doc)
	if err != nil {
		return "", err
	}
	for _, r := range regions {
		if r.name != name {
			continue
		}
		lines := strings.SplitAfter(doc, "\n")
		if !strings.HasSuffix(body, "\n") {
			body += "\n"
		}
		var b strings.Builder
		for _, l := range lines[:r.begin+1] {
			b.WriteString(l)
		}
		b.WriteString(body)
		fmt.Fprintf(&b, "<!-- simdocs:%s end sha256=%s -->\n", name, hash(body))
		for _, l := range lines[r.end+1:] {
			b.WriteString(l)
		}
		return b.String(), nil
	}
	return "", fmt.Errorf("the doc has no region %s", name)
}
