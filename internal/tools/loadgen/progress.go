package loadgen

import (
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progressLine redraws one status line while a run lasts: elapsed time
// against the duration, and running counts. It owns one goroutine, ended
// by stop.
type progressLine struct {
	quit chan struct{}
	done chan struct{}
}

func startProgress(g *gen, w io.Writer) *progressLine {
	bar := progressbar.NewOptions64(g.cfg.Duration.Milliseconds(),
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetWidth(20),
		progressbar.OptionSetPredictTime(false),
		progressbar.OptionShowDescriptionAtLineEnd(),
		progressbar.OptionThrottle(100*time.Millisecond),
	)
	p := &progressLine{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-p.quit:
				p.draw(g, bar)
				_ = bar.Finish()
				fmt.Fprintln(w)
				return
			case <-t.C:
				p.draw(g, bar)
			}
		}
	}()
	return p
}

func (p *progressLine) draw(g *gen, bar *progressbar.ProgressBar) {
	el := time.Since(g.start)
	var c [numOutcomes]int64
	for _, v := range g.rec.totals() {
		for o := range numOutcomes {
			c[o] += v[o]
		}
	}
	ok := countsOf(c)
	bar.Describe(fmt.Sprintf("%d sent (%.0f/s)  allowed %d  throttled %d  failed-open %d  failed %d",
		ok.Sent, float64(ok.Sent)/max(el.Seconds(), 1e-3), ok.Allowed, ok.Throttled, ok.FailedOpen, ok.Failed))
	_ = bar.Set64(min(el.Milliseconds(), g.cfg.Duration.Milliseconds()))
}

func (p *progressLine) stop() {
	close(p.quit)
	<-p.done
}
