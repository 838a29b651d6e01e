#!/usr/bin/env bash
# lat-floor.sh: `roce-emu lat -o send -s 8` between two processes on
# loopback against the raw-UDP ping-pong (internal/cmd/udppingpong), and
# against the raw ping-pong with an ACK-sized datagram after each message
# (-acks: the two datagrams an RC SEND ping-pong puts on the wire), in
# alternated rounds. Prints each round's t_typical (µs, one way, as
# ib_send_lat reports it), then the medians and the ratios of the medians:
# the figures docs/datapath.md quotes against issue 13's targets.
#
# By default both processes of each pair run on CPU 0 (taskset), so that a
# round trip is two context switches on one CPU, as on a busy host; with
# BUSY=1 they busy-poll (lat --busy-poll, udppingpong -busy-poll 50us) and
# run unpinned, one per CPU (pinned to one CPU, busy-polling starves the
# peer).
#
# The raw datagrams are udppingpong's default 60 bytes (lat's SEND is a
# 24-byte UDP payload), as in the figures of docs/datapath.md.
#
# Latency on a shared 2-vCPU machine moves by a third from one run to the
# next: compare medians of many rounds taken in one sitting, never two
# single runs.
#
# usage: [ROUNDS=11] [N=20000] [BUSY=1] scripts/lat-floor.sh [LAT_FLAGS...]
# needs: go, taskset and timeout (util-linux, coreutils)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-11}
n=${N:-20000}
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
go build -o "$dir/roce-emu" ./cmd/roce-emu
go build -o "$dir/udppingpong" ./internal/cmd/udppingpong
pin=(taskset -c 0)
lbusy=()
ubusy=()
if [ "${BUSY:-}" = 1 ]; then
	pin=()
	lbusy=(--busy-poll)
	ubusy=(-busy-poll 50us)
fi

# typical prints the t_typical column of an ib_send_lat-style result.
typical() {
	awk '/t_typical/ {for (i = 1; i <= NF; i++) if ($i ~ /^t_typical/) c = i; getline; print $c; exit}'
}

# Each client gets a minute: a side that did not start (a port taken, a
# start-up slower than the sleeps) ends the script with its log instead of
# hanging it.
raw() {
	"${pin[@]}" timeout 60 "$dir/udppingpong" -bind 127.0.0.2 -port 14791 -n "$n" "${ubusy[@]}" "$@" >"$dir/raw-server.log" 2>&1 &
	sleep 0.5
	"${pin[@]}" timeout 60 "$dir/udppingpong" -bind 127.0.0.1 -n "$n" "${ubusy[@]}" "$@" 127.0.0.2:14791 >"$dir/raw-client.log" 2>&1 || true
	wait || true
	grep -o 't_typical [0-9.]*' "$dir/raw-client.log" | cut -d' ' -f2
}

lat() {
	"${pin[@]}" timeout 60 "$dir/roce-emu" lat -o send -s 8 -n "$n" --bind 127.0.0.2 "${lbusy[@]}" "$@" >"$dir/lat-server.log" 2>&1 &
	sleep 0.8
	"${pin[@]}" timeout 60 "$dir/roce-emu" lat -o send -s 8 -n "$n" --bind 127.0.0.1 "${lbusy[@]}" "$@" 127.0.0.2 >"$dir/lat-client.log" 2>&1 || true
	wait || true
	typical <"$dir/lat-client.log"
}

# need NAME VALUE: VALUE, or the logs of the pair that gave nothing and exit.
need() {
	if [ -z "$2" ]; then
		echo "lat-floor: no t_typical from $1; its logs:" >&2
		tail -n 5 "$dir/$1"-server.log "$dir/$1"-client.log >&2
		exit 1
	fi
	echo "$2"
}

echo "round  raw  raw+ACKs  lat   (t_typical µs; load $(cut -d' ' -f1-3 /proc/loadavg))"
for r in $(seq "$rounds"); do
	a=$(need raw "$(raw)")
	b=$(need raw "$(raw -acks)")
	c=$(need lat "$(lat "$@")")
	echo "$r $a $b $c" | tee -a "$dir/rounds" | awk '{printf "%5d  %s  %s  %s\n", $1, $2, $3, $4}'
done
awk '{a[NR] = $2; b[NR] = $3; c[NR] = $4}
function med(x, n,   i, j, t) {
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (x[j] < x[i]) { t = x[i]; x[i] = x[j]; x[j] = t }
	return n % 2 ? x[(n + 1) / 2] : (x[n / 2] + x[n / 2 + 1]) / 2
}
END {
	ma = med(a, NR); mb = med(b, NR); mc = med(c, NR)
	printf "medians: raw %.2f, raw+ACKs %.2f, lat %.2f; lat/raw %.2f, lat/raw+ACKs %.2f\n", ma, mb, mc, mc / ma, mc / mb
}' "$dir/rounds"
