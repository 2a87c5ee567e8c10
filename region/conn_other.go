//go:build !linux

package region

import "syscall"

// unreadBytes is unknown off Linux: the stall judgement then relies on
// the last bytes read and on deferring a late check.
func unreadBytes(syscall.RawConn) int { return 0 }

// psiFile is PSI, which is Linux's: never available here.
type psiFile struct{}

func newPSIFile() *psiFile         { return &psiFile{} }
func (*psiFile) read() (psi, bool) { return psi{}, false }
func (*psiFile) close()            {}

// statFile is /proc/stat, which is Linux's: never available here.
type statFile struct{}

func newStatFile() *statFile             { return &statFile{} }
func (*statFile) read() (cpuTimes, bool) { return cpuTimes{}, false }
func (*statFile) close()                 {}
