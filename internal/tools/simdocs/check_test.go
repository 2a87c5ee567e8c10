package main

import (
	"os"
	"strings"
	"testing"

	"github.com/allot-dev/allot/internal/tools/sim"
)

// The shift weights of the grid's 3-, 5- and 10-region rows are ones
// allot-sim accepts: one weight per region, 90 % to region 0.
func TestShiftToFitsTheRegions(t *testing.T) {
	for _, n := range []int{3, 5, 10} {
		w, err := sim.ParseWeights(shiftTo(n))
		if err != nil {
			t.Fatal(err)
		}
		c := sim.Default()
		c.Regions, c.ShiftAt, c.ShiftTo = n, 30e9, w
		if err := c.Validate(); err != nil {
			t.Errorf("%d regions, --shift-to %s: %v", n, shiftTo(n), err)
		}
		var sum float64
		for _, x := range w {
			sum += x
		}
		if got := w[0] / sum; got < 0.8999 || got > 0.9001 {
			t.Errorf("%d regions, --shift-to %s: region 0 gets %.4f, want 0.9", n, shiftTo(n), got)
		}
	}
}

// check catches each way a region goes wrong.
func TestCheckCatches(t *testing.T) {
	body := "Generated at `abc` by `make simdocs`:\n\n```sh\nallot-sim --seed 1\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
	region := func(name, body string) string {
		return "<!-- simdocs:" + name + " begin -->\n" + body + "<!-- simdocs:" + name + " end sha256=" + hash(body) + " -->\n"
	}
	good := "# Doc\n\nprose\n\n" + region("x", body) + "\nmore prose\n\n" + region("y", body)
	known := []string{"x", "y"}
	if err := check(good, known); err != nil {
		t.Fatalf("a good doc: %v", err)
	}
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"hand edit", strings.Replace(good, "| 1 | 2 |", "| 1 | 3 |", 1), "edited by hand"},
		{"no begin", strings.Replace(good, "<!-- simdocs:y begin -->\n", "", 1), "ends without its begin"},
		{"no end", good[:strings.LastIndex(good, "<!-- simdocs:y end")], "never ends"},
		{"nested", strings.Replace(good, "<!-- simdocs:x end", "<!-- simdocs:y begin -->\n<!-- simdocs:x end", 1), "begins inside"},
		{"malformed", strings.Replace(good, "simdocs:x begin -->", "simdocs:x start -->", 1), "malformed marker"},
		{"no hash", strings.Replace(good, " sha256="+hash(body), "", 1), "no sha256"},
		{"twice", good + region("x", body), "twice"},
		{"unknown", good + region("z", body), "no section"},
		{"missing", "# Doc\n" + region("x", body), "region y is missing"},
		{"table first", "# Doc\n" + region("x", "| a |\n|---|\n\n```sh\nallot-sim\n```\n") + region("y", body), "before the commands"},
		{"no table", "# Doc\n" + region("x", "```sh\nallot-sim\n```\n") + region("y", body), "no table"},
		{"table outside", good + "\n| hand | made |\n|---|---|\n", "outside the generated regions"},
	} {
		err := check(tc.doc, known)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error with %q", tc.name, err, tc.want)
		}
	}
	// A table inside a fenced block outside the regions is code, not a
	// table.
	if err := check(good+"\n```text\n| not | a table |\n```\n", known); err != nil {
		t.Errorf("a fenced table: %v", err)
	}
}

// replace rewrites one region's body and its hash, and nothing else.
func TestReplace(t *testing.T) {
	doc := "a\n<!-- simdocs:x begin -->\nold\n<!-- simdocs:x end sha256=0000000000000000 -->\nb\n"
	got, err := replace(doc, "x", "new\n")
	if err != nil {
		t.Fatal(err)
	}
	want := "a\n<!-- simdocs:x begin -->\nnew\n<!-- simdocs:x end sha256=" + hash("new\n") + " -->\nb\n"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if _, err := replace(doc, "y", "new\n"); err == nil {
		t.Error("replacing a region the doc lacks: no error")
	}
}

func TestShellQuote(t *testing.T) {
	got := shellJoin([]string{"--partition", "1>0@25s-45s", "--shift-to", "0.9,0.05,0.05", "*>0@1s-2s", "it's"})
	want := `--partition '1>0@25s-45s' --shift-to 0.9,0.05,0.05 '*>0@1s-2s' 'it'\''s'`
	if got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

// README.md runs the acceptance scenario the doc's region shows.
func TestReadmeRunsTheAcceptanceScenario(t *testing.T) {
	b, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), acceptanceCommand()) {
		t.Errorf("README.md does not show %q", acceptanceCommand())
	}
}
