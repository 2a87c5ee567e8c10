// Package chaos holds the chaos suite: scenarios that break one link or
// process of the sandbox topology (package sandbox) under load and check
// the documented promises. The suite is build-tagged: run it with
//
//	go test -tags chaos -count=1 -v -run Chaos ./internal/tools/chaos/
//
// (make chaos); docs/chaos.md records a run.
package chaos
