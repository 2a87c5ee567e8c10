package coord

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"

	coordv1 "github.com/allot-dev/allot/proto/coord/v1"
)

// Transport carries coordinator messages between regions. Publish sends a
// message to every region, the sender's own included; Messages delivers
// what arrives, from all regions, as the machine's input (as it traveled:
// Received.Wire). Delivery is best effort: a lost message only makes some
// region see a partition, which is safe.
type Transport interface {
	Publish(ctx context.Context, m *coordv1.Message) error
	Messages() <-chan Received
	// MaxPayload is the largest message the transport carries, in bytes.
	MaxPayload() int
	Close() error
}

// inboxSize bounds the messages a transport buffers for a slow
// coordinator; beyond it messages are dropped (a partition, as above).
const inboxSize = 4096

// Hub is an in-memory network of Transports for tests: every region
// joins it, and links can be cut and healed one direction at a time.
type Hub struct {
	mu      sync.Mutex
	members map[string][]*memTransport
	cut     map[[2]string]bool
}

// NewHub returns an empty hub.
func NewHub() *Hub {
	return &Hub{members: map[string][]*memTransport{}, cut: map[[2]string]bool{}}
}

// Join returns a transport for a coordinator of region. Several
// coordinators (an active and a standby) may join as the same region.
func (h *Hub) Join(region string) Transport {
	t := &memTransport{hub: h, region: region, in: make(chan Received, inboxSize)}
	h.mu.Lock()
	h.members[region] = append(h.members[region], t)
	h.mu.Unlock()
	return t
}

// Cut drops messages from region from to region to until Heal.
func (h *Hub) Cut(from, to string) {
	h.mu.Lock()
	h.cut[[2]string{from, to}] = true
	h.mu.Unlock()
}

// Isolate cuts every link to and from region.
func (h *Hub) Isolate(region string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for other := range h.members {
		if other != region {
			h.cut[[2]string{region, other}] = true
			h.cut[[2]string{other, region}] = true
		}
	}
}

// Heal restores every link.
func (h *Hub) Heal() {
	h.mu.Lock()
	clear(h.cut)
	h.mu.Unlock()
}

type memTransport struct {
	hub    *Hub
	region string
	in     chan Received

	closeOnce sync.Once
	mu        sync.Mutex // guards closed and sends into in
	closed    bool
}

func (t *memTransport) Publish(ctx context.Context, m *coordv1.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t.hub.mu.Lock()
	var to []*memTransport
	for region, ms := range t.hub.members {
		if region == t.region || !t.hub.cut[[2]string{t.region, region}] {
			to = append(to, ms...)
		}
	}
	t.hub.mu.Unlock()
	// Encoded as NATS carries it, so the hub's regions decode what they
	// receive as NATSTransport's do.
	b, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("coord: marshal: %w", err)
	}
	for _, r := range to {
		r.deliver(b)
	}
	return nil
}

func (t *memTransport) deliver(b []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	select {
	case t.in <- Received{Wire: b}:
	default: // full: dropped, like a slow NATS consumer
	}
}

func (t *memTransport) Messages() <-chan Received { return t.in }

func (t *memTransport) MaxPayload() int { return 1 << 20 }

func (t *memTransport) Close() error {
	t.closeOnce.Do(func() {
		t.mu.Lock()
		t.closed = true
		close(t.in)
		t.mu.Unlock()
	})
	return nil
}
