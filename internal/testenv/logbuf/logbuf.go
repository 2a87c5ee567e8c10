// Package logbuf is a log sink for tests: an io.Writer that the code
// under test may write from its own goroutines while the test reads it.
package logbuf

import (
	"strings"
	"sync"
)

// Buffer is a strings.Builder behind a lock. The zero value is ready.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
