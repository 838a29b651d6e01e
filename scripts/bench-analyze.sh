#!/usr/bin/env bash
# bench-analyze.sh: roce-emu analyze and decode against tshark, side by side
# in one run, on a capture this script generates (internal/gencap): 4 RC
# connections, 64 KiB RDMA WRITEs at MTU 1024, 1% of data packets CE-marked
# with a CNP each, a go-back-N episode every 50 messages; 266,080
# packets, 285 MB. Prints, for each tool over RUNS runs (default 3), the
# shortest and the median wall-clock and CPU (user + system) seconds, and
# the ratios of CPU seconds (the steadier figure on a shared machine, and
# the one the target is set on) and of wall-clock seconds. roce-emu reads,
# decodes and analyzes on one goroutine (no pipeline): on an idle machine
# its wall-clock and CPU seconds are close.
#
# usage: [RUNS=3] scripts/bench-analyze.sh [MESSAGES_PER_CONNECTION]   (default 1000)
# needs: go, tshark (Wireshark 4.0 or later), bc
set -euo pipefail
cd "$(dirname "$0")/.."
msgs=${1:-1000}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
go build -o "$dir/roce-emu" ./cmd/roce-emu
go build -o "$dir/gencap" ./internal/cmd/gencap
"$dir/gencap" -o "$dir/bench.pcap" -messages "$msgs"
ls -l "$dir/bench.pcap" | awk '{printf "capture: %d bytes\n", $5}'
command -v tshark >/dev/null || { echo "tshark is not installed (apt-get install tshark)"; exit 1; }

# run NAME CMD...: the shortest wall-clock and CPU (user + system) seconds
# of CMD over RUNS runs (default 3), then their medians, output discarded,
# page cache warm.
runs=${RUNS:-3}
TIMEFORMAT='%3R %3U %3S'
run() {
	local name=$1; shift
	"$@" >/dev/null 2>&1 || true # warm the page cache
	: >"$dir/times"
	for _ in $(seq "$runs"); do
		# bash's time: milliseconds (GNU time prints hundredths, too
		# coarse for analyze's tenth of a second).
		{ time "$@" >/dev/null 2>&1; } 2>"$dir/time"
		tail -1 "$dir/time" | awk '{printf "%.3f %.3f\n", $1, $2 + $3}' >>"$dir/times"
	done
	local wall cpu
	wall=$(awk '{print $1}' "$dir/times" | sort -n | awk '{v[NR] = $1} END {print v[1], v[int((NR + 1) / 2)]}')
	cpu=$(awk '{print $2}' "$dir/times" | sort -n | awk '{v[NR] = $1} END {print v[1], v[int((NR + 1) / 2)]}')
	echo "$name wall=${wall% *} cpu=${cpu% *} wall_median=${wall#* } cpu_median=${cpu#* }"
}
f="$dir/bench.pcap"
ts=(-o infiniband.rroce.port:4791 --disable-heuristic rpcrdma_infiniband --disable-heuristic eth_over_ib --disable-heuristic mellanox_eoib)
results=$(
	run analyze "$dir/roce-emu" analyze --json "$f"
	run decode_json "$dir/roce-emu" decode --json "$f"
	run decode "$dir/roce-emu" decode "$f"
	run tshark_iostat tshark "${ts[@]}" -r "$f" -q -z io,stat,0
	run tshark_fields tshark "${ts[@]}" -r "$f" -T fields -e infiniband.bth.opcode -e infiniband.bth.destqp -e infiniband.bth.psn -e infiniband.aeth.syndrome
)
echo "$results"
# get NAME FIELD: a figure of a tool's line (wall, cpu, wall_median, cpu_median).
get() { echo "$results" | awk -v n="$1" -v f="$2" '$1 == n {for (i = 2; i <= NF; i++) {split($i, kv, "="); if (kv[1] == f) print kv[2]}}'; }
ratio() { echo "scale=1; $(get "$2" "$3") / $(get "$1" "$3")" | bc; }
for c in "analyze tshark_iostat analyze vs tshark -q -z io,stat,0" "decode_json tshark_fields decode --json vs tshark -T fields" "decode tshark_fields decode vs tshark -T fields"; do
	set -- $c
	ours=$1 theirs=$2
	shift 2
	echo "$*: $(ratio "$ours" "$theirs" cpu)x less CPU time (shortest; medians $(ratio "$ours" "$theirs" cpu_median)x), $(ratio "$ours" "$theirs" wall)x less wall-clock time (shortest; medians $(ratio "$ours" "$theirs" wall_median)x)"
done
"$dir/roce-emu" analyze --json "$f" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("analyze found", r["summary"]["gbn_episodes"], "go-back-N episodes,", r["summary"]["frames"], "frames")' 2>/dev/null || true
