#!/usr/bin/env bash
# fuzz.sh: runs every native Go fuzzer of the module (every `func FuzzXxx` in
# a _test.go file) for DURATION each, one after another, and prints one line
# per fuzzer: package, name, result, executions and new corpus entries as
# `go test -fuzz` last reported them. Not run by CI. A failing input is kept
# by Go under the package's testdata/fuzz/FuzzXxx/ (commit it as a
# regression seed once fixed); the script goes on with the next fuzzer and
# exits 1 at the end if any failed.
#
# usage: scripts/fuzz.sh [DURATION]        (default 10m; a Go duration: 30s, 2m)
#        PARALLEL=N scripts/fuzz.sh 30s    (fuzzing workers per fuzzer; default 1,
#                                           for a shared machine)
#        ONLY=REGEXP scripts/fuzz.sh 1m    (only fuzzers whose name matches)
set -uo pipefail
cd "$(dirname "$0")/.."
dur=${1:-10m}
par=${PARALLEL:-1}
only=${ONLY:-.}
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

# Every fuzzer as "PKGDIR NAME", found in the sources.
mapfile -t fuzzers < <(grep -rl --include='*_test.go' '^func Fuzz' . |
	while read -r f; do
		d=$(dirname "$f")
		sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$f" | while read -r n; do echo "$d $n"; done
	done | sort -u | grep -E " ($only)" )
echo "fuzzers: ${#fuzzers[@]}, ${dur} each, -parallel ${par}, $(go version | cut -d' ' -f3)"
failed=0
for entry in "${fuzzers[@]}"; do
	d=${entry% *}
	n=${entry#* }
	out="$log/$n.txt"
	if go test "$d" -run '^$' -fuzz "^${n}\$" -fuzztime "$dur" -parallel "$par" >"$out" 2>&1; then
		res=ok
	else
		res=FAIL
		failed=1
	fi
	# The last progress line: "fuzz: elapsed: 30s, execs: 123456 (4115/sec), new interesting: 3 (total: 40)".
	last=$(grep -E '^fuzz: elapsed' "$out" | tail -1 | sed 's/^fuzz: //')
	printf '%-22s %-20s %-4s %s\n' "$d" "$n" "$res" "${last:-no progress line}"
	if [ "$res" = FAIL ]; then
		grep -E -- '--- FAIL|Failing input|panic:|testdata/fuzz' "$out" | head -5 | sed 's/^/    /'
	fi
done
exit $failed
