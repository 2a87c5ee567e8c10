package coord

// DemandSource gives the coordinator its region's demand: a
// demand.Collector (the nodes' snapshots over NATS) or a demand.DrainFunc
// (a lease.Manager's DrainDemand in the same process).
type DemandSource interface {
	// Drain calls fn with every key's admitted and denied tokens since the
	// previous Drain.
	Drain(fn func(key string, admitted, denied int64))
}
