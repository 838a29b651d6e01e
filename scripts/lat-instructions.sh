#!/usr/bin/env bash
# lat-instructions.sh: user-space instructions per round trip of
# `roce-emu lat -o send -s 8` and of the raw-UDP baseline (udppingpong),
# counted by valgrind's callgrind on the timing side while its peer runs
# natively. Instruction counts do not move with the machine's load, where
# the latency of a ping-pong on a shared 2-vCPU machine moves by half from
# one run to the next; they leave out the kernel and the scheduler, so they
# measure the user-space part of the gap to raw UDP only.
#
# Each tool runs twice, with SHORT and LONG round trips (default 20000 and
# 60000); the difference divided by LONG-SHORT is the cost of one round
# trip, without set-up and teardown. Under callgrind the timing side runs
# about 50 times slower, so the Endpoint's timer (Options.ReplyHold) fires
# more often per round trip than in a native run: compare builds with the
# same flags, not these counts with a native run's CPU time.
#
# usage: [SHORT=20000 LONG=60000] scripts/lat-instructions.sh [LAT_FLAGS...]
# needs: go, valgrind
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)"; exit 1; }
short=${SHORT:-20000}
long=${LONG:-60000}
if [ "$long" -le "$short" ]; then echo "LONG ($long) must be above SHORT ($short)"; exit 1; fi
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
go build -o "$dir/roce-emu" ./cmd/roce-emu
go build -o "$dir/udppingpong" ./internal/cmd/udppingpong
# Go's asynchronous preemption signals trip an assertion in callgrind.
export GODEBUG=asyncpreemptoff=1

# ir N CMD...: the instructions callgrind counted for CMD.
ir() {
	local out="$dir/cg.$1"
	shift
	valgrind --tool=callgrind --callgrind-out-file="$out" "$@" >/dev/null 2>&1
	awk '/^summary:/ {print $2}' "$out"
}

lat() {
	"$dir/roce-emu" lat -o send -s 8 -n "$1" --bind 127.0.0.2 "${@:2}" >/dev/null 2>&1 &
	sleep 0.5
	ir "lat$1" "$dir/roce-emu" lat -o send -s 8 -n "$1" --bind 127.0.0.1 "${@:2}" 127.0.0.2
	wait
}

raw() {
	"$dir/udppingpong" -bind 127.0.0.2 -port 14791 -n "$1" >/dev/null 2>&1 &
	sleep 0.3
	ir "raw$1" "$dir/udppingpong" -bind 127.0.0.1 -n "$1" 127.0.0.2:14791
	wait
}

a=$(lat "$short" "$@")
b=$(lat "$long" "$@")
c=$(raw "$short")
d=$(raw "$long")
n=$((long - short))
echo "instructions per round trip (user space, timing side):"
echo "  roce-emu lat -o send -s 8 $*: $(( (b - a) / n ))"
echo "  udppingpong (raw UDP):        $(( (d - c) / n ))"
