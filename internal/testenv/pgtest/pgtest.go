// Package pgtest gives each test its own PostgreSQL database: created with
// a unique name on the server at ALLOT_TEST_POSTGRES (default
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable), dropped when
// the test ends.
//
// Without a reachable server the test is skipped with a message saying
// how to get one, or fails when ALLOT_REQUIRE_POSTGRES=1 (scripts/test.sh
// sets it once it has PostgreSQL running), so CI cannot skip silently.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultURL is the server tests use when ALLOT_TEST_POSTGRES is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// Database creates a fresh database and returns its URL.
func Database(t testing.TB) string {
	t.Helper()
	admin := os.Getenv("ALLOT_TEST_POSTGRES")
	if admin == "" {
		admin = DefaultURL
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		msg := "PostgreSQL not reachable at " + redacted(admin) + ": " + err.Error() +
			" (run scripts/test.sh, which installs and starts it, or set ALLOT_TEST_POSTGRES)"
		if os.Getenv("ALLOT_REQUIRE_POSTGRES") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	defer conn.Close(context.Background())
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "allot_test_" + hex.EncodeToString(b[:])
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		// WITH (FORCE) ends connections a test left open (PostgreSQL 13+).
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	u.Path = "/" + name
	return u.String()
}

func redacted(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		return u.Redacted()
	}
	return raw
}
