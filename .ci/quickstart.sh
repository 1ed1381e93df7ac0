#!/usr/bin/env bash
# The README's Quick start, as a newcomer uses it: a fresh crate whose Cargo.toml is the
# Quick start's [dependencies] block (its path pointed at this checkout) and whose
# main.rs is the Quick start's code, checked with `cargo check`. The code alone is also a
# doctest of idem-runtime; this checks the install line with it.
#
# Offline against the workspace's Cargo.lock (copied in), so it needs nothing the
# workspace build has not fetched. Its target dir is kept (target/quickstart), so a
# second run only re-checks what changed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/idem-quickstart.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src"

# The first ```toml and ```rust blocks after the "## Quick start" heading.
block() { # language
    awk -v lang="$1" '
        /^## / { inside = ($0 == "## Quick start") }
        inside && !done && $0 == "```" lang { on = 1; next }
        on && $0 == "```" { on = 0; done = 1 }
        on { print }
    ' "$root/README.md"
}
deps="$(block toml)"
code="$(block rust)"
if [ -z "$deps" ] || [ -z "$code" ]; then
    echo "quickstart: README.md has no ## Quick start with a toml and a rust block" >&2
    exit 1
fi
case "$deps" in
*'path = "../idem/idem-runtime"'*) ;;
*) echo 'quickstart: the install line no longer reads path = "../idem/idem-runtime"; update .ci/quickstart.sh' >&2; exit 1 ;;
esac

{
    printf '[package]\nname = "quickstart"\nversion = "0.1.0"\nedition = "2024"\npublish = false\n\n'
    printf '%s\n' "${deps//..\/idem\/idem-runtime/$root/idem-runtime}"
    printf '\n[workspace]\n'
} >"$tmp/Cargo.toml"
printf '%s\n' "$code" >"$tmp/src/main.rs"
cp "$root/Cargo.lock" "$tmp/Cargo.lock"

target="${CARGO_TARGET_DIR:-$root/target}/quickstart"
(cd "$tmp" && CARGO_TARGET_DIR="$target" cargo check -q --offline)
echo "quickstart: the README's Quick start compiles in a new crate"
