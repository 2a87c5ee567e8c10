package sim

import (
	"fmt"
	"os"
	"time"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/tools/loadgen"
)

// WritePNG draws the hottest key's admissions per second, by region and
// in total, against the ideal global bucket's, with the load generator's
// plot (loadgen.Report.WritePNG): a simulated run and a sandbox run look
// alike.
func (r *Result) WritePNG(path string) error {
	c := r.cfg
	rep := &loadgen.Report{
		Rate: r.hotRate, Interval: time.Second, Duration: c.Duration, Seed: c.Seed,
		Keys:  loadgen.Keys{Dist: loadgen.Hot, Count: 1},
		Ideal: &algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: c.Limit, Period: time.Second, Burst: c.Burst},
	}
	for _, rr := range r.Regions {
		rep.Regions = append(rep.Regions, loadgen.RegionReport{Region: rr.Name})
	}
	for i, p := range r.PerSecond {
		pt := loadgen.Point{Offset: time.Duration(i) * time.Second, IdealAdmitted: p.Ideal, Total: loadgen.Counts{Allowed: p.Admitted}}
		for _, n := range p.Regions {
			pt.Regions = append(pt.Regions, loadgen.Counts{Allowed: n})
		}
		rep.Series = append(rep.Series, pt)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("sim: plot: %w", err)
	}
	if err := rep.WritePNG(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("sim: plot: %w", err)
	}
	return f.Close()
}
