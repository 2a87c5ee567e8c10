// Package coordv1 holds the Go types of allot.coord.v1: the messages the
// regions' coordinators exchange over NATS (Message: report chunks, acks
// and wants of a rebalance round) and the demand snapshots nodes publish
// to their region's coordinator (Demand).
//
// coord.proto, beside this file, is the contract of that wire: nodes and
// coordinators of different builds read each other's messages by it, so
// a field keeps its number and meaning. The other Go file here is
// generated from it by buf (`make proto`, buf.gen.yaml) and must not be
// edited by hand: change the .proto and regenerate.
package coordv1
