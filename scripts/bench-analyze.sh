#!/usr/bin/env bash
# bench-analyze.sh: roce-emu analyze and decode against tshark, side by side
# in one run, on a capture this script generates (internal/gencap): 4 RC
# connections, 64 KiB RDMA WRITEs at MTU 1024, 1% of data packets CE-marked
# with a CNP each, a go-back-N episode every 50 messages; 266,080
# packets, 285 MB. Prints the shortest wall-clock seconds of each tool over
# RUNS runs (default 3) and the ratios.
#
# usage: [RUNS=3] scripts/bench-analyze.sh [MESSAGES_PER_CONNECTION]   (default 1000)
# needs: go, tshark (Wireshark 4.0 or later)
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

# run NAME CMD...: the shortest wall-clock seconds of CMD over RUNS runs
# (default 3; the machine may be shared), output discarded, cache warm.
runs=${RUNS:-3}
run() {
	local name=$1; shift
	"$@" >/dev/null 2>&1 || true # warm the page cache
	local best="" t0 t1 d
	for _ in $(seq "$runs"); do
		t0=$(date +%s.%N)
		"$@" >/dev/null 2>&1
		t1=$(date +%s.%N)
		d=$(echo "$t1 - $t0" | bc)
		if [ -z "$best" ] || [ "$(echo "$d < $best" | bc)" = 1 ]; then best=$d; fi
	done
	echo "$name $best"
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
get() { echo "$results" | awk -v n="$1" '$1 == n {print $2}'; }
echo "analyze vs tshark -q -z io,stat,0: $(echo "scale=1; $(get tshark_iostat) / $(get analyze)" | bc)x faster"
echo "decode --json vs tshark -T fields: $(echo "scale=1; $(get tshark_fields) / $(get decode_json)" | bc)x faster"
echo "decode vs tshark -T fields: $(echo "scale=1; $(get tshark_fields) / $(get decode)" | bc)x faster"
"$dir/roce-emu" analyze --json "$f" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("analyze found", r["summary"]["gbn_episodes"], "go-back-N episodes,", r["summary"]["frames"], "frames")' 2>/dev/null || true
