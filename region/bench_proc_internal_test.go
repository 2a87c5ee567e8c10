package region

import "testing"

// What a check pays to sample the machine (at most every psiReadEvery):
// a read of the PSI file and one of /proc/stat's head.
func BenchmarkProcReads(b *testing.B) {
	b.Run("psi", func(b *testing.B) {
		f := newPSIFile()
		defer f.close()
		if _, ok := f.read(); !ok {
			b.Skip("no /proc/pressure/cpu here")
		}
		b.ReportAllocs()
		for b.Loop() {
			f.read()
		}
	})
	b.Run("stat", func(b *testing.B) {
		f := newStatFile()
		defer f.close()
		if _, ok := f.read(); !ok {
			b.Skip("no /proc/stat here")
		}
		b.ReportAllocs()
		for b.Loop() {
			f.read()
		}
	})
}
