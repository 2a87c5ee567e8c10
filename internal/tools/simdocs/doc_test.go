package main

import (
	"os"
	"testing"
)

// docs/simulation.md's generated regions are well formed and untouched
// by hand: what simdocs -check says, without running anything.
func TestDocRegions(t *testing.T) {
	b, err := os.ReadFile("../../../docs/simulation.md")
	if err != nil {
		t.Fatal(err)
	}
	if err := check(string(b), names()); err != nil {
		t.Fatalf("docs/simulation.md: %v\n(go run ./internal/tools/simdocs remakes the regions)", err)
	}
}
