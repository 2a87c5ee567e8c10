package region

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A worker done with its pipeline sends the next one itself (kick with
// self): the calls queued meanwhile go out without waking another
// goroutine, and only pipelines beyond the first go to other workers.
func TestWorkerSendsTheNextPipelineItself(t *testing.T) {
	s := &Store{opts: Options{Pipelines: 2, MaxBatch: 2}, done: make(chan struct{})}
	// A buffered hand-off: a pipeline handed to "an idle worker" waits
	// in it (with no room, kick would start a worker goroutine).
	sh := &shard{s: s, work: make(chan *pipe, 1)}
	calls := make([]*call, 5)
	for i := range calls {
		calls[i] = &call{}
	}
	sh.queue = append(sh.queue, calls...)
	sh.mu.Lock()
	mine := sh.kick(time.Now(), true)
	sh.mu.Unlock()

	require.NotNil(t, mine, "the calling worker keeps the first pipeline")
	assert.Equal(t, calls[:2], mine.calls)
	other := <-sh.work
	assert.Equal(t, calls[2:4], other.calls, "the second slot goes to an idle worker")
	assert.Equal(t, []*pipe{mine, other}, sh.inflight, "both count as in flight from now")
	assert.Equal(t, calls[4:], sh.queue, "the rest waits for a free slot")

	// Without self (a submit, a stall check) nothing is kept back.
	sh.inflight = sh.inflight[:1]
	sh.mu.Lock()
	assert.Nil(t, sh.kick(time.Now(), false))
	sh.mu.Unlock()
	assert.Equal(t, calls[4:], (<-sh.work).calls)
	assert.Empty(t, sh.queue)
}
