#!/usr/bin/env bash
# soak.sh: 10 minutes (or DURATION) of RC traffic between two Endpoints
# over UDP on 127.0.0.1 and 127.0.0.2: 4 QP pairs each doing RDMA WRITE,
# RDMA READ and SEND in turn (1 byte to 64 KiB, every byte checked), each
# side's outgoing packets lost with probability 5%, duplicated with 2% and
# delayed by 2 ms with 5% (reordering them). Every 10 s it logs RSS, the
# Go heap in use and live (after a collection), goroutines and the
# traffic; at the end it checks that RSS, the live heap and goroutines
# stayed flat after the first minute (internal/cmd/soak, which says how).
# Exit status 1 on a wrong byte, a failed or missing completion, or growth.
# Not run by CI.
#
# usage: scripts/soak.sh [DURATION] [SOAK FLAGS...]   (default 10m; e.g. scripts/soak.sh 30m -mem)
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-10m}
shift || true
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/soak" ./internal/cmd/soak
"$bin/soak" -duration "$dur" "$@"
