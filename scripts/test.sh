#!/usr/bin/env bash
# The whole test run: format check, lints, then every unit and end-to-end test.
# End-to-end tests start real nodes on 127.0.0.1 and a scripted LLM; nothing else is contacted.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo build --workspace --locked --bins
cargo test --workspace --all-targets --locked "$@"
