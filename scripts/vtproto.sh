#!/bin/sh
# Generates proto/ratelimit/v1/ratelimit_vtproto.pb.go (vtprotobuf's
# marshalling, used by server.WireCodec) from a proto3 twin of
# ratelimit.proto: protoc-gen-go-vtproto cannot read editions files.
# Usage (from the repository root, as `make proto` runs it):
#   scripts/vtproto.sh <buf command...>
set -eu
src=proto/ratelimit/v1/ratelimit.proto
# The twin means the same only while the edition file sets, file-wide,
# the two features proto3 has by default as vtprotobuf generates it, and
# sets no feature anywhere else.
grep -q '^option features.field_presence = IMPLICIT;$' "$src"
grep -q '^option features.utf8_validation = NONE;$' "$src"
if [ "$(grep -c 'features\.' "$src")" -ne 2 ]; then
	echo "$src: features beyond the file-wide two; the proto3 twin would not be equivalent" >&2
	exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/ratelimit/v1"
sed -e 's/^edition = "2023";$/syntax = "proto3";/' -e '/^option features\./d' "$src" >"$tmp/ratelimit/v1/ratelimit.proto"
printf 'version: v2\n' >"$tmp/buf.yaml"
"$@" generate "$tmp" --template buf.gen.vtproto.yaml
