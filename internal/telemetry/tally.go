package telemetry

import (
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/metric"
)

// tally is a counter of the check path kept as one atomic per label set
// and reported through an observable counter when the reader collects.
// Counting is then one atomic add, where the SDK's synchronous counter
// resolves the label set on every Add: two of a check's four records,
// half of its telemetry's cost (BenchmarkObserveCheck). What it gives
// up is exemplars, which only the latency histograms need.
type tally struct {
	inst  metric.Int64ObservableCounter
	mu    sync.Mutex
	cells map[attrKey]*cell // bounded like the labels
}

// cell is one label set's count.
type cell struct {
	n   atomic.Int64
	obs []metric.ObserveOption
}

func (t *Telemetry) newTally(name, desc string) (*tally, error) {
	inst, err := t.meter.Int64ObservableCounter(name, metric.WithDescription(desc))
	return &tally{inst: inst, cells: map[attrKey]*cell{}}, err
}

// cell is the count of the label set (ka=a, kb=b), made on first use;
// kb "" means one label. The check path keeps the cells of its fixed
// label sets (labelOptions) and comes here only for others.
func (t *Telemetry) cell(tl *tally, ka, a, kb, b string) *cell {
	k := attrKey{ka, a, kb, b}
	tl.mu.Lock()
	defer tl.mu.Unlock()
	c, ok := tl.cells[k]
	if !ok {
		c = &cell{obs: t.option(ka, a, kb, b).obs}
		tl.cells[k] = c
	}
	return c
}

func (tl *tally) observe(o metric.Observer) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for _, c := range tl.cells {
		// A series appears at its first count, as a synchronous
		// counter's does: the fixed label sets' cells are made ahead.
		if n := c.n.Load(); n > 0 {
			o.ObserveInt64(tl.inst, n, c.obs...)
		}
	}
}
