package region

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/testenv/redistest"
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

// A pipeline takes, when its worker sends it, the calls queued after it
// was formed (up to MaxBatch): checks whose goroutines were already
// runnable share its round trip instead of waiting for the next one.
func TestPipelineTakesWhatQueuedBeforeItIsSent(t *testing.T) {
	redistest.Require(t)
	s, err := Open(context.Background(), []string{redistest.Server(t).Addr}, Options{MaxBatch: 4})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	_, err = s.Take(context.Background(), testGroup) // loads the script
	require.NoError(t, err)
	st0 := s.Stats()

	sh := s.single
	reqs := make([]*request, 6)
	for i := range reqs {
		r := newRequest(checkScript(testGroup...), 1)
		r.calls[0].group = testGroup[0]
		r.pending.Store(1)
		r.done = make(chan struct{}, 1)
		reqs[i] = r
	}
	p := &pipe{calls: []*call{&reqs[0].calls[0]}}
	sh.mu.Lock()
	sh.inflight = append(sh.inflight, p)
	for _, r := range reqs[1:] {
		sh.queue = append(sh.queue, &r.calls[0])
	}
	sh.mu.Unlock()

	var b sendBuffers
	next := sh.send(p, &b)
	require.NotNil(t, next, "the two calls beyond MaxBatch go next")
	require.Len(t, p.calls, 4, "p took queued calls up to MaxBatch")
	for _, r := range reqs[:4] {
		<-r.done
		assert.NoError(t, r.replies[0].err)
	}
	st := s.Stats()
	assert.Equal(t, int64(1), st.Pipelines-st0.Pipelines, "one round trip for the four")
	assert.Equal(t, int64(4), st.Calls-st0.Calls)

	sh.send(next, &b)
	for _, r := range reqs[4:] {
		<-r.done
		assert.NoError(t, r.replies[0].err)
	}
}
