package lease

import (
	"hash/maphash"
	"sync/atomic"
)

func mapBytes(m *Manager, b []byte) uint64 { return maphash.Bytes(m.seed, b) }

type atomicInt64 = atomic.Int64
