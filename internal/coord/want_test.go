package coord

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	coordv1 "github.com/allot-dev/allot/proto/coord/v1"
)

// Every round loses eu's report to ap and us's ack to eu on their first
// trip: the gathers ask for them at half their phase, get them again, and
// every round still grows as a group.
func TestLostReportsAndAcksAreAskedForAndTheRoundGrows(t *testing.T) {
	n := startVnet(t, "ap", "eu", "us")
	n.setDemand(testKey, 20, 360, 20)
	n.run(3 * testKnobs().Interval) // past the listening epoch
	sent := map[*coordv1.Message]bool{}
	dropped := 0
	n.deliver = func(from, to *member, m *coordv1.Message) []time.Duration {
		lose := (from.region == "eu" && to.region == "ap" && m.GetReport() != nil) ||
			(from.region == "us" && to.region == "eu" && m.GetAck() != nil)
		if lose && !sent[m] {
			sent[m] = true
			dropped++
			return nil
		}
		return []time.Duration{time.Millisecond}
	}
	start := len(n.members[0].rounds)
	n.setDemand(testKey, 20, 20, 360)
	require.True(t, n.within(10*testKnobs().Interval, func() bool {
		return near(n.shares(testKey), []float64{20. / 300, 20. / 300, 260. / 300}, 0.01)
	}), "shares followed the shift: %v", n.shares(testKey))
	require.Positive(t, dropped)
	for _, mb := range n.members {
		rounds := mb.rounds[min(start, len(mb.rounds)):]
		require.NotEmpty(t, rounds, mb.id)
		for _, r := range rounds {
			assert.True(t, r.Stats.Group, "%s epoch %d: no group", mb.id, r.Stats.Epoch)
			assert.Equal(t, 3, r.Stats.Heard, "%s epoch %d: heard", mb.id, r.Stats.Epoch)
		}
	}
	for _, id := range []string{"ap", "eu"} { // ap misses a report, eu an ack
		mb := n.members[map[string]int{"ap": 0, "eu": 1}[id]]
		assert.Positive(t, mb.rounds[len(mb.rounds)-1].Stats.Asked, "%s asked for nothing", id)
	}
	assert.Zero(t, n.members[2].rounds[len(n.members[2].rounds)-1].Stats.Asked, "us missed nothing")
}

// A Want is answered with what this region sent in the round it names,
// once per asking region and kind, and only when it names this region.
func TestWantIsAnsweredOncePerRegion(t *testing.T) {
	r := &round{}
	want := &coordv1.Want{Reports: []string{"eu"}, Acks: []string{"eu"}}
	assert.Empty(t, r.answer("ap", "eu", want), "nothing sent yet")
	r.report = []*coordv1.Message{{Region: "eu"}, {Region: "eu"}}
	assert.Empty(t, r.answer("ap", "us", want), "a Want naming another region")
	assert.Len(t, r.answer("ap", "eu", want), 2, "the report's chunks")
	assert.Empty(t, r.answer("ap", "eu", want), "the report again")
	r.ack = &coordv1.Message{Region: "eu"}
	assert.Equal(t, []*coordv1.Message{r.ack}, r.answer("ap", "eu", want), "the ack, once sent")
	assert.Empty(t, r.answer("ap", "eu", want))
	assert.Len(t, r.answer("us", "eu", want), 3, "another region's Want")
}
