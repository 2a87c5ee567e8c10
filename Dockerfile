# Allot's images: one image holding the three commands; a compose service
# picks one with its entrypoint (/allot-node, /allot-coordinator,
# /allot-load). Build from the repository root:
#
#   docker build -t allot:dev .
#
# Needs BuildKit (the default builder since Docker 23; on older Docker set
# DOCKER_BUILDKIT=1) for the cache mounts below.
#
# Build stage: static binaries (no cgo), module downloads cached in their
# own layer so a source change does not refetch them.
FROM golang:1.26 AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags="-s -w" -o /out/allot-node ./cmd/node && \
    go build -trimpath -ldflags="-s -w" -o /out/allot-coordinator ./cmd/coordinator && \
    go build -trimpath -ldflags="-s -w" -o /out/allot-load ./cmd/allot-load

# Run stage: distroless static, non-root; nothing but the binaries and CA
# certificates. The commands default to loopback addresses, so a
# container must be given 0.0.0.0 listen flags (docker-compose.yml does).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /
USER nonroot:nonroot
EXPOSE 8080 8081 8070
ENTRYPOINT ["/allot-node"]
