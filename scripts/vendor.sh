#!/usr/bin/env bash
# Vendors every dependency into vendor/ (git-ignored) for offline, air-gapped builds, and writes
# the cargo config that makes `cargo build --release --offline` use it.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .cargo
cargo vendor --locked vendor > .cargo/config.toml.new
mv .cargo/config.toml.new .cargo/config.toml
echo "vendored $(ls vendor | wc -l) crates into vendor/; .cargo/config.toml now reads:" >&2
cat .cargo/config.toml
echo "copy this folder (with vendor/ and .cargo/) to the offline machine and run: cargo build --release --offline" >&2
