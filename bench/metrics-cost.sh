#!/bin/sh
# What idem's `metrics` feature costs the replay path when no recorder is installed,
# measured in one run: builds idem-bench's replay measurement without the feature
# (--no-default-features) and with it (the default), keeps both binaries, runs them
# alternately so both see the same machine, and prints each one's median and
#
#   ratio metrics-replay VALUE      (ops/s with metrics / ops/s without)
#
# Usage: bench/metrics-cost.sh [PAIRS]   (default 5 alternating pairs; each run is the
# best of 5 rounds of 2,000,000 replays). Release builds: slow the first time.
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

# Lines: `replay metrics=on ns/op 581.2 ops/s 1720578`.
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
    printf "replay metrics-off median %.1f ns/op %.0f ops/s (%d runs)\n", a, 1e9 / a, n["off"]
    printf "replay metrics-on  median %.1f ns/op %.0f ops/s (%d runs)\n", b, 1e9 / b, n["on"]
    printf "ratio metrics-replay %.2f\n", a / b
}' "$out/runs.txt"
