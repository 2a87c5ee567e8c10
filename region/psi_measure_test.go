package region

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// How often the PSI file may be read (psiReadEvery), measured: with
// three busy processes on this machine's CPUs, the share of time with
// tasks waiting as seen when read every millisecond and every
// psiReadEvery. Run with ALLOT_MEASURE_PSI=1 on a machine with at most
// two CPUs and nothing else busy (docs/benchmarks.md); it takes 8 s.
func TestMeasurePSIReadInterval(t *testing.T) {
	if os.Getenv("ALLOT_MEASURE_PSI") == "" {
		t.Skip("a measurement: set ALLOT_MEASURE_PSI=1")
	}
	if _, err := os.Stat("/proc/pressure/cpu"); err != nil {
		t.Skip("no /proc/pressure/cpu here")
	}
	for range 3 {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
	var f psiFile
	t.Cleanup(f.close)
	share := func(every time.Duration) float64 {
		a, ok := f.read()
		require.True(t, ok)
		start := time.Now()
		for time.Since(start) < 2*time.Second {
			time.Sleep(every)
			_, _ = f.read()
		}
		b, _ := f.read()
		return float64(b.total-a.total) / float64(time.Since(start))
	}
	var fast, slow []float64
	for range 2 {
		fast = append(fast, share(time.Millisecond))
		slow = append(slow, share(psiReadEvery))
	}
	t.Logf("tasks waiting for a CPU, read every 1ms: %.0f%%, %.0f%%; every %v: %.0f%%, %.0f%%",
		100*fast[0], 100*fast[1], psiReadEvery, 100*slow[0], 100*slow[1])
	for _, s := range slow {
		assert.GreaterOrEqual(t, s, waitedShare, "three busy loops read every psiReadEvery: contended")
	}
}
