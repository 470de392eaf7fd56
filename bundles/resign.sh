#!/bin/sh
# Re-sign the example bundles with the DEVELOPMENT key.
#
#   bundles/resign.sh [REVISION]
#
# REVISION defaults to the current one plus 1 (a host that accepted revision N
# refuses anything lower). Run from anywhere; needs cargo.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
key="$here/dev-key.DEVELOPMENT-ONLY"
policy="$root/policies/dev.yaml"

current=$(sed -n 's/^revision: *//p' "$here/examples/dev/manifest.yaml" 2>/dev/null || true)
revision=${1:-$(( ${current:-0} + 1 ))}

sluice() {
    cargo run --quiet --manifest-path "$root/Cargo.toml" -- "$@"
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

sluice bundle sign --key "$key" --policy "$policy" --revision "$revision" \
    --ttl 3650d --out "$tmp/dev"
sluice bundle sign --key "$key" --policy "$policy" --revision "$revision" \
    --ttl 3650d --out "$tmp/dev.tar.gz"
sluice bundle verify --trust "$here/dev-trust.yaml" "$tmp/dev"
sluice bundle verify --trust "$here/dev-trust.yaml" "$tmp/dev.tar.gz"

mkdir -p "$here/examples"
rm -rf "$here/examples/dev"
mv "$tmp/dev" "$here/examples/dev"
mv "$tmp/dev.tar.gz" "$here/examples/dev.tar.gz"
echo "re-signed bundles/examples/dev{,.tar.gz} at revision $revision"
