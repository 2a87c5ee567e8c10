//go:build !linux

package policystore

// closeWatch needs inotify; elsewhere the file watcher applies a change
// once the file has been stable for one poll interval.
type closeWatch struct{}

func newCloseWatch(string) *closeWatch  { return nil }
func (*closeWatch) rewatch(string) bool { return false }
func (*closeWatch) closed() bool        { return true }
func (*closeWatch) close()              {}
