package main

import (
	"bytes"
	"context"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/allot-dev/allot/internal/tools/loadgen"
)

func TestRunWritesReportCSVAndPNG(t *testing.T) {
	s, err := loadgen.StartNoop("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	err = run(context.Background(), []string{
		"--target", "a=" + s.Addr() + ",b=" + s.Addr(), "--split", "a=1,b=0", "--shift-at", "500ms", "--shift-split", "a=0,b=1",
		"--rate", "200", "--duration", "1s", "--keys", "hot", "--ideal-rate", "10/s", "--ideal-burst", "5",
		"--csv", filepath.Join(dir, "l.csv"), "--png", filepath.Join(dir, "l.png"),
	}, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	for _, want := range []string{"sent 200 ", "ideal (token bucket 10/1s, burst 5", "       a   100", "       b   100"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	f, err := os.Open(filepath.Join(dir, "l.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Fatalf("png: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "l.csv")); err != nil || !strings.HasPrefix(string(b), "t_seconds,") {
		t.Fatalf("csv: %v %.40q", err, b)
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--keys", "pareto"},
		{"--protocol", "quic"},
		{"--target", "us=a:1,us=a:1"},
		{"--shift-at", "1s"},
		{"--ideal-burst", "5"},
		{"--ideal-rate", "x/s"},
		{"--key-field", "route"},
		{"stray"},
	} {
		var out, errOut bytes.Buffer
		if err := run(context.Background(), args, &out, &errOut); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

func TestBadSweepFlags(t *testing.T) {
	for _, args := range [][]string{
		{"sweep", "--levels", "0"},
		{"sweep", "--levels", "1,1"},
		{"sweep", "--precision", "approximate"},
		{"sweep", "--keys", "zipf"},
		{"sweep", "--limits", "tiny"},
		{"sweep", "--warmup", "0s"},
		{"sweep", "--node-bin", "/nonexistent/allot-node"},
		{"sweep", "stray"},
	} {
		var out, errOut bytes.Buffer
		if err := run(context.Background(), args, &out, &errOut); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// Each bad ratio flag is refused for its own reason, before anything
// starts (the node binary here does not exist, so a flag checked after
// it would be refused for the wrong reason).
func TestBadRatioFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"ratio", "--mode", "zipf"}, "--mode"},
		{[]string{"ratio", "--pairs", "0"}, "--pairs"},
		{[]string{"ratio", "--concurrency", "-1"}, "--concurrency"},
		{[]string{"ratio", "--measure", "0s"}, "--measure"},
		{[]string{"ratio", "--node-bin", "/nonexistent/allot-node"}, "--node-bin"},
		{[]string{"ratio", "stray"}, "unexpected arguments"},
	} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), c.args, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one about %s", c.args, err, c.want)
		}
	}
}
