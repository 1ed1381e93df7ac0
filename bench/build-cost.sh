#!/usr/bin/env bash
# What adding idem costs a project's clean build, next to adding `cached`: makes two
# fresh crates in a temp dir, each a binary with the same tokio features and one
# memoized async fn,
#
#   idem    idem-runtime by path, default features, one #[idempotent] fn
#   cached  cached 4.x with `async` (its defaults too), one #[cached] fn
#
# builds each from clean (`cargo build`, debug, an empty target dir of its own, offline
# after one fetch) alternately, and prints each build's seconds, both medians and
#
#   cost-ratio build-cost VALUE      (median of idem's time / cached's, pair by pair)
#
# and `cost-ratio build-cost-cpu`, the same for CPU seconds (user + sys), which a loaded
# machine moves less. Lower is better, hence `cost-ratio` (the bench's `ratio` lines are
# higher-is-better); until release 0.2 both are also printed under their old name,
# `ratio build-cost…`, for scripts that read it.
#
# Usage: bench/build-cost.sh [PAIRS]   (default 3 alternating pairs; each build takes
# tens of seconds on 2 cores). IDEM_DIR=/other/checkout measures another checkout of
# idem. KEEP=1 keeps the temp dir and prints its path (for `cargo tree` in the crates).
# Run it on a quiet machine: builds use every core, so other load shows in both times.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
idem_dir="$(cd "${IDEM_DIR:-$here}" && pwd)"
pairs=${1:-3}
# The fresh crates build alone: nothing shared with the workspace's target dirs.
unset CARGO_TARGET_DIR CARGO_BUILD_BUILD_DIR CARGO_BUILD_TARGET_DIR RUSTC_WRAPPER CARGO_BUILD_RUSTC_WRAPPER

tmp="$(mktemp -d "${TMPDIR:-/tmp}/idem-build-cost.XXXXXX")"
if [ "${KEEP:-0}" = 1 ]; then echo "crates in $tmp"; else trap 'rm -rf "$tmp"' EXIT; fi

new_crate() { # name, dependency lines, main.rs
    mkdir -p "$tmp/$1/src"
    cat >"$tmp/$1/Cargo.toml" <<EOF
[package]
name = "cost-$1"
version = "0.1.0"
edition = "2024"
publish = false

[dependencies]
tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
$2

# A crate of its own, not a member of any workspace above the temp dir.
[workspace]
EOF
    printf '%s\n' "$3" >"$tmp/$1/src/main.rs"
}

new_crate idem "idem-runtime = { path = \"$idem_dir/idem-runtime\" }" '
use idem_runtime::idempotent;

/// The one requirement idem puts on an error type, written out (no derive crate).
#[derive(Debug)]
struct ShopError(idem_runtime::Error);

impl From<idem_runtime::Error> for ShopError {
    fn from(e: idem_runtime::Error) -> Self {
        ShopError(e)
    }
}

#[idempotent(key = "charge:{order_id}")]
async fn charge(order_id: u64) -> Result<u64, ShopError> {
    Ok(order_id * 100)
}

#[tokio::main]
async fn main() {
    println!("{:?}", charge(7).await);
}'

new_crate cached 'cached = { version = "4", features = ["async"] }' '
use cached::proc_macro::cached;

#[cached]
async fn charge(order_id: u64) -> u64 {
    order_id * 100
}

#[tokio::main]
async fn main() {
    println!("{}", charge(7).await);
}'

# Resolve and download once (online if the network is there, else from the local
# cache); every timed build is then offline, so only compiling is measured.
for c in idem cached; do
    (
        cd "$tmp/$c"
        cargo generate-lockfile -q 2>/dev/null || cargo generate-lockfile -q --offline
        cargo fetch -q 2>/dev/null || cargo fetch -q --offline
    )
done

build() { # crate -> "wall-seconds cpu-seconds" on stdout
    rm -rf "$tmp/$1/target"
    # CPU time (user + sys of cargo and every rustc and build script it waited for)
    # moves far less with the machine's load than the wall time does.
    (cd "$tmp/$1" && /usr/bin/time -f '%e %U %S' -o "$tmp/$1.time" \
        cargo build -q --offline >/dev/null 2>"$tmp/$1.err") \
        || { cat "$tmp/$1.err" >&2; echo "build of $1 failed" >&2; exit 1; }
    # Hundreds of MB of debug artifacts: gone before the next build needs the disk.
    [ "${KEEP:-0}" = 1 ] || rm -rf "$tmp/$1/target"
    awk '{ printf "%.2f %.2f\n", $1, $2 + $3 }' "$tmp/$1.time"
}

: >"$tmp/runs.txt"
for ((i = 0; i < pairs; i++)); do
    # Alternate which goes first, so neither always builds right after the other.
    if ((i % 2 == 0)); then order="idem cached"; else order="cached idem"; fi
    for c in $order; do
        read -r wall cpu < <(build "$c")
        echo "build $c pair $i seconds $wall cpu $cpu" | tee -a "$tmp/runs.txt"
    done
done

awk '
function median(a, n,    i, j, t) {
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{ s[$2, $4] = $6; u[$2, $4] = $8; if ($4 + 1 > n) n = $4 + 1 }
END {
    for (k = 0; k < n; k++) {
        i[k + 1] = s["idem", k]; c[k + 1] = s["cached", k]; r[k + 1] = s["idem", k] / s["cached", k]
        iu[k + 1] = u["idem", k]; cu[k + 1] = u["cached", k]; ru[k + 1] = u["idem", k] / u["cached", k]
    }
    printf "build idem median %.2f s (cpu %.2f s), cached median %.2f s (cpu %.2f s), %d pairs\n",
        median(i, n), median(iu, n), median(c, n), median(cu, n), n
    printf "cost-ratio build-cost-cpu %.2f\n", median(ru, n)
    printf "cost-ratio build-cost %.2f\n", median(r, n)
    # The old spelling, kept until release 0.2.
    printf "ratio build-cost-cpu %.2f\n", median(ru, n)
    printf "ratio build-cost %.2f\n", median(r, n)
}' "$tmp/runs.txt"
