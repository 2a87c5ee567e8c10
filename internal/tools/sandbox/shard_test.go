package sandbox

import "testing"

func TestMasterOf(t *testing.T) {
	nodes := `07c3 127.0.0.1:30004@40004 slave e7d1 0 1426238317239 4 connected
67ed 127.0.0.1:30002@40002 master - 0 1426238316232 2 connected 5461-10922
292f 127.0.0.1:30003@40003,host.example master - 0 1426238318243 3 connected 10923-16383 [93->-e7d1]
e7d1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460 12 [93-<-292f]
`
	for _, c := range []struct {
		slot int64
		want string
	}{{0, "127.0.0.1:30001"}, {5460, "127.0.0.1:30001"}, {5461, "127.0.0.1:30002"}, {16383, "127.0.0.1:30003"}} {
		if got, ok := masterOf(nodes, c.slot); !ok || got != c.want {
			t.Errorf("slot %d: got %q, %v; want %q", c.slot, got, ok, c.want)
		}
	}
	if got, ok := masterOf("e7d1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-100\n", 101); ok {
		t.Errorf("slot 101 of an incomplete map: got %q", got)
	}
}
