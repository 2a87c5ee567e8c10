package node

import (
	"errors"

	"google.golang.org/grpc"
)

// Crash stops the node as a killed process would stop, for chaos tests:
// the gRPC and HTTP listeners and every open connection are cut at once
// (calls in flight fail, nothing drains), the NATS connection closes
// before the last demand snapshot, gossip ends without a goodbye, and
// the lease manager drops the tokens it holds instead of returning them
// (lease.Manager.Abort): they stay debited from the region's buckets
// until their leases expire. It returns how many leased tokens were
// stranded. In process it still ends the node's goroutines and closes its
// Redis connections, as the kernel would for a dead process. Use Crash or
// Close, once.
func (n *Node) Crash() (stranded int64, err error) {
	n.closing.Store(true)
	// Serving stops first, so no call is answered by a half-dead node
	// (without its leases it would decide by on_store_failure).
	n.grpc.Stop()
	var errs []error
	for _, l := range n.https {
		errs = append(errs, l.srv.Close())
		<-l.done
	}
	n.https = nil
	for _, h := range n.crashHooks {
		h()
	}
	n.crashHooks = nil
	if n.res.members != nil {
		errs = append(errs, n.res.members.Crash())
	}
	if n.leases != nil {
		stranded = n.leases.Abort()
	}
	if err := <-n.served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		errs = append(errs, err)
	}
	// What is left: the store connections, the policy watcher, the
	// publisher (its last snapshot fails on the closed connection) and
	// the Close of an aborted lease manager, which returns nothing.
	errs = append(errs, n.closeAll())
	return stranded, errors.Join(errs...)
}
