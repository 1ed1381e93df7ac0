#!/bin/sh
# What idem's `metrics` feature costs the replay path when no recorder is installed,
# measured in one run: builds idem-bench's replay measurement without the feature
# (--no-default-features) and with it (the default), keeps both binaries, runs them
# alternately so both see the same machine, and prints each one's best and median and
#
#   ratio metrics-replay VALUE      (best ops/s with metrics / best ops/s without)
#
# Usage: bench/metrics-cost.sh [PAIRS]   (default 5 alternating pairs; each run is the
# best of 5 rounds of 2,000,000 replays). Release builds: slow the first time.
# CALLGRIND=1 also counts instructions per replay under valgrind (the difference
# between 200,000 and 100,000 replays, so setup cancels out): a figure the machine's
# load does not move.
set -eu
cd "$(dirname "$0")/.."
pairs=${1:-5}
target=${CARGO_TARGET_DIR:-target}
out="$target/metrics-cost"
mkdir -p "$out"

# One target dir for both: the dependencies build once, only idem's crates twice.
cargo build --release -p idem-bench --bin idem-bench-replay --no-default-features
cp "$target/release/idem-bench-replay" "$out/replay-off"
cargo build --release -p idem-bench --bin idem-bench-replay
cp "$target/release/idem-bench-replay" "$out/replay-on"

: >"$out/runs.txt"
i=0
while [ "$i" -lt "$pairs" ]; do
    # Alternate which goes first, so neither always runs on a machine the other warmed.
    if [ $((i % 2)) -eq 0 ]; then order="off on"; else order="on off"; fi
    for m in $order; do
        "$out/replay-$m" | tee -a "$out/runs.txt"
    done
    i=$((i + 1))
done

# Lines: `replay metrics=on ns/op 581.2 ops/s 1720578`. Load from elsewhere only ever
# adds time, so the fastest run of each build is the closest to its own cost: the ratio
# compares those; the medians show how much the machine moved.
awk '
function median(a, n,    i, j, t) {
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
$1 == "replay" { m = substr($2, 9); n[m]++; ns[m, n[m]] = $4 }
END {
    if (!n["on"] || !n["off"]) { print "no figures" > "/dev/stderr"; exit 1 }
    for (k = 1; k <= n["off"]; k++) off[k] = ns["off", k]
    for (k = 1; k <= n["on"]; k++) on[k] = ns["on", k]
    a = median(off, n["off"]); b = median(on, n["on"])
    # median() sorted the arrays: the first is the fastest.
    printf "replay metrics-off best %.1f ns/op %.0f ops/s, median %.1f ns/op (%d runs)\n", off[1], 1e9 / off[1], a, n["off"]
    printf "replay metrics-on  best %.1f ns/op %.0f ops/s, median %.1f ns/op (%d runs)\n", on[1], 1e9 / on[1], b, n["on"]
    printf "ratio metrics-replay %.2f\n", off[1] / on[1]
}' "$out/runs.txt"

if [ "${CALLGRIND:-0}" = 1 ]; then
    for m in off on; do
        for n in 100000 200000; do
            valgrind --tool=callgrind --callgrind-out-file=/dev/null \
                "$out/replay-$m" --callgrind "$n" 2>&1 |
                awk -v m="$m" -v n="$n" '/Collected/ { print m, n, $NF }'
        done
    done | awk '{ c[$1, $2] = $3 }
        END {
            off = (c["off", 200000] - c["off", 100000]) / 100000
            on = (c["on", 200000] - c["on", 100000]) / 100000
            printf "replay instructions metrics-off %.0f metrics-on %.0f (+%.0f)\n", off, on, on - off
        }'
fi
