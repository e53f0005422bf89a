#!/usr/bin/env bash
# Soak: a mesh of real botmesh processes on 127.0.0.1 under steady mixed traffic, with
# peers restarting (SIGTERM and kill -9 alternately), for a bounded time. Samples RSS,
# open files, threads and cache sizes per node and fails if any keeps growing.
#
#   scripts/soak.sh                    # 20 minutes (the default)
#   scripts/soak.sh --minutes 5        # shorter
#   scripts/soak.sh --seconds 60       # a smoke run (TTL-bound caches are not judged)
#   scripts/soak.sh --out-md docs/soak-latest.md --out-csv /tmp/soak.csv
#
# Every other option: `target/release/botmesh-bench soak --help`. Not part of
# scripts/test.sh (too long). See docs/soak.md for the method and the last figures.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
cargo build --release --locked -p botmesh -p botmesh-bench
target_dir="${CARGO_TARGET_DIR:-target}"
exec "$target_dir/release/botmesh-bench" soak --botmesh "$target_dir/release/botmesh" "$@"
