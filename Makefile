# Allot's build. `make test` is the one test command (CI runs it via .ci/run).
export GOTOOLCHAIN := local
BUF_VERSION := v1.75.0

.PHONY: all build run sandbox chaos test test-short proto lint bench clean simdocs

all: build

build:
	go build -o bin/allot-node ./cmd/node
	go build -o bin/allot-coordinator ./cmd/coordinator
	go build -o bin/allot-load ./cmd/allot-load
	go build -o bin/allotctl ./cmd/allotctl
	go build -o bin/allot-sim ./cmd/allot-sim

# The main job: a standalone node with the example policies.
run:
	go build -o bin/allot-node ./cmd/node
	exec bin/allot-node --store examples/policies.yaml

# The 3-region sandbox on this machine (internal/tools/sandbox/): real redis-servers,
# embedded NATS supercluster, coordinators and nodes. Ctrl-C stops it all.
sandbox:
	go build -o bin/allot-sandbox ./cmd/allot-sandbox
	exec bin/allot-sandbox

# The chaos suite against the sandbox (docs/chaos.md), a few minutes.
chaos:
	go test -tags chaos -count=1 -timeout 20m -v -run Chaos ./internal/tools/chaos/

# Installs redis-server, gcc and PostgreSQL when missing (as root, with
# apt-get, quietly), then runs every test with the race detector.
# Redis-backed tests fail instead of skipping. What it starts (a PostgreSQL
# cluster) it stops when it ends; services already running are reused.
test:
	@./scripts/test.sh

# Regenerates docs/simulation.md's tables (internal/tools/simdocs): runs the
# commands each table shows at this tree, about 6 minutes on 2 cores.
# SIMDOCS_FLAGS=-big adds the 10-region, 10^6-key speed run (9 min, 5.6 GB),
# -sandbox the sandbox replay (real processes, 15 min); -check only checks.
simdocs:
	go run ./internal/tools/simdocs $(SIMDOCS_FLAGS)

lint:
	gofmt -l . | (! grep .)
	go vet ./...
	go tool staticcheck ./...

# Regenerates proto/ with pinned generators: buf (compiler) at BUF_VERSION,
# protoc-gen-go, protoc-gen-go-grpc and protoc-gen-go-vtproto at the
# versions go.mod's tool lines pin. vtprotobuf's marshalling of the node's
# messages (server.WireCodec) comes from a proto3 twin of ratelimit.proto
# (scripts/vtproto.sh says why).
proto:
	go run github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION) generate
	./scripts/vtproto.sh go run github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)

bench:
	go test -run '^$$' -bench . -benchmem ./...

clean:
	rm -rf bin
