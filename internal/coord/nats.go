package coord

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/allot-dev/allot/internal/coord/demand"
	coordv1 "github.com/allot-dev/allot/proto/coord/v1"
)

// SubjectPrefix is the subject space of the coordinators: a region's
// coordinator publishes on allot.rebalance.<region> and every coordinator
// subscribes to allot.rebalance.*. Across regions NATS gateways carry the
// rebalance subjects (interest-based, so demand, on demand.Prefix, stays
// in its region).
const SubjectPrefix = "allot.rebalance."

// NATSTransport is the Transport over a NATS connection (in a supercluster,
// the region's own cluster). It does not own the connection.
type NATSTransport struct {
	nc     *nats.Conn
	region string
	log    *slog.Logger
	sub    *nats.Subscription
	in     chan Received

	mu     sync.Mutex // guards closed and sends into in
	closed bool
}

// NewNATSTransport subscribes to every region's rebalance subject and
// publishes on region's.
func NewNATSTransport(nc *nats.Conn, region string, log *slog.Logger) (*NATSTransport, error) {
	if log == nil {
		log = slog.Default()
	}
	t := &NATSTransport{nc: nc, region: region, log: log, in: make(chan Received, inboxSize)}
	sub, err := demand.Subscribe(nc, SubjectPrefix+"*", t.receive)
	if err != nil {
		return nil, fmt.Errorf("coord: %w", err)
	}
	t.sub = sub
	return t, nil
}

// receive passes a message on as it traveled: the machine decodes it
// (Received.Wire). msg.Data is the message's own copy of the payload.
func (t *NATSTransport) receive(msg *nats.Msg) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	select {
	case t.in <- Received{Wire: msg.Data}:
	default:
		t.log.Warn("coord: inbox full, dropping message", "subject", msg.Subject)
	}
}

// Publish implements Transport.
func (t *NATSTransport) Publish(ctx context.Context, m *coordv1.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("coord: marshal: %w", err)
	}
	if err := t.nc.Publish(SubjectPrefix+t.region, b); err != nil {
		return fmt.Errorf("coord: publish %s%s: %w", SubjectPrefix, t.region, err)
	}
	return nil
}

// Messages implements Transport.
func (t *NATSTransport) Messages() <-chan Received { return t.in }

// MaxPayload implements Transport: the server's max payload.
func (t *NATSTransport) MaxPayload() int { return int(t.nc.MaxPayload()) }

// Close unsubscribes; the connection stays open.
func (t *NATSTransport) Close() error {
	err := t.sub.Unsubscribe()
	t.mu.Lock()
	if !t.closed {
		t.closed = true
		close(t.in)
	}
	t.mu.Unlock()
	if err != nil {
		return fmt.Errorf("coord: unsubscribe: %w", err)
	}
	return nil
}
