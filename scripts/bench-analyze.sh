#!/usr/bin/env bash
# bench-analyze.sh: roce-emu analyze and decode against tshark, side by side
# in one run, on a capture this script generates (internal/gencap): 4 RC
# connections, 64 KiB RDMA WRITEs at MTU 1024, 1% of data packets CE-marked
# with a CNP each, a go-back-N episode every 50 messages; 266,080
# packets, 285 MB. Prints the shortest wall-clock seconds of each tool over
# RUNS runs (default 3) and the ratios.
#
# usage: [RUNS=3] scripts/bench-analyze.sh [MESSAGES_PER_CONNECTION]   (default 1000)
# needs: go, tshark (Wireshark 4.0 or later), GNU time (/usr/bin/time), bc
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

# run NAME CMD...: the shortest wall-clock and the shortest CPU (user +
# system) seconds of CMD over RUNS runs (default 3), output discarded, page
# cache warm. On a shared machine the CPU seconds are the steadier figure;
# the ratios below use them.
runs=${RUNS:-3}
run() {
	local name=$1; shift
	"$@" >/dev/null 2>&1 || true # warm the page cache
	local wall="" cpu="" t w c
	for _ in $(seq "$runs"); do
		/usr/bin/time -o "$dir/time" -f "%e %U %S" "$@" >/dev/null 2>&1
		t=$(tail -1 "$dir/time")
		w=$(echo "$t" | awk '{print $1}')
		c=$(echo "$t" | awk '{print $2 + $3}')
		if [ -z "$wall" ] || [ "$(echo "$w < $wall" | bc)" = 1 ]; then wall=$w; fi
		if [ -z "$cpu" ] || [ "$(echo "$c < $cpu" | bc)" = 1 ]; then cpu=$c; fi
	done
	echo "$name wall=$wall cpu=$cpu"
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
get() { echo "$results" | awk -v n="$1" '$1 == n {sub("cpu=", "", $3); print $3}'; }
echo "analyze vs tshark -q -z io,stat,0: $(echo "scale=1; $(get tshark_iostat) / $(get analyze)" | bc)x less CPU time"
echo "decode --json vs tshark -T fields: $(echo "scale=1; $(get tshark_fields) / $(get decode_json)" | bc)x less CPU time"
echo "decode vs tshark -T fields: $(echo "scale=1; $(get tshark_fields) / $(get decode)" | bc)x less CPU time"
"$dir/roce-emu" analyze --json "$f" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("analyze found", r["summary"]["gbn_episodes"], "go-back-N episodes,", r["summary"]["frames"], "frames")' 2>/dev/null || true
