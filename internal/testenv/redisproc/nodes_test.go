package redisproc

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseClusterNodes(t *testing.T) {
	nodes := ParseClusterNodes(`07c3 127.0.0.1:30004@40004 slave e7d1 0 1426238317239 4 connected
292f 127.0.0.1:30003@40003,host.example master - 0 1426238318243 3 connected 10923-16383 [93->-e7d1]
e7d1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460 12

`)
	require.Len(t, nodes, 3, "the blank line is skipped")
	assert.Equal(t, ClusterNode{ID: "07c3", Addr: "127.0.0.1:30004", Bus: "40004", Flags: []string{"slave"}, MasterID: "e7d1", Slots: []string{}}, nodes[0])
	assert.Equal(t, "40003", nodes[1].Bus, "the hostname after the bus port is dropped")
	assert.True(t, nodes[2].Has("myself"))
	assert.True(t, nodes[2].Has("master"))
	assert.False(t, nodes[2].Has("mast"), "flags match whole")
	for slot, want := range map[int64]bool{0: true, 12: true, 5460: true, 5461: false, 10923: false} {
		assert.Equal(t, want, nodes[2].Serves(slot), slot)
	}
	assert.True(t, nodes[1].Serves(16383))
	assert.False(t, nodes[1].Serves(93), "a migration marker is not a slot")
}
