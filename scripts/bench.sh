#!/usr/bin/env bash
# The benchmark: real botmesh nodes on 127.0.0.1 (3 and 8), side by side with a bare hyper
# server and Redis pub/sub measured in the same run with the same payloads; then the two
# transports (HTTP mesh, Redis Streams) side by side at 3, 8 and 32 bots.
#
#   scripts/bench.sh            full run (< 15 min): writes docs/benchmarks.{md,json} and docs/scaling.{md,json}
#   scripts/bench.sh --quick    smoke run (< 2 min): writes $TARGET/bench/*-quick.{md,json}
#
# Further options go to botmesh-bench (see `botmesh-bench --help`), e.g.
#   --note "others were compiling in parallel"   --perf DIR   --nodes 3   --no-redis
#
# Not part of the run: `botmesh-bench flood` measures a real peer's envelope latency while
# junk batches flood one node's bridge (about 20 s; see bench/src/flood.rs). Nor is
# `botmesh-bench agents --out-md docs/agents.md`: what botmesh adds to an ACP agent's turn
# and the node's RSS with agents attached (about 30 s; see bench/src/agents.rs).
#
# Installs redis-server from the distribution's packages when it is missing (apt-get).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

quick=0
for a in "$@"; do
  [ "$a" = "--quick" ] && quick=1
done

if ! command -v redis-server >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    echo "bench.sh: installing redis-server (apt-get) for the Redis baseline" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
  else
    echo "bench.sh: redis-server missing and no apt-get: the Redis baseline will be skipped" >&2
  fi
fi

cargo build --release -p botmesh -p botmesh-bench

target="${CARGO_TARGET_DIR:-target}"
if [ "$quick" = 1 ]; then
  # A quick run must not overwrite the committed full-run results.
  out="$target/bench"
  mkdir -p "$out"
  md="$out/benchmarks-quick.md"
  json="$out/benchmarks-quick.json"
  scaling_md="$out/scaling-quick.md"
  scaling_json="$out/scaling-quick.json"
  quick_flag=(--quick)
else
  mkdir -p docs
  md="docs/benchmarks.md"
  json="docs/benchmarks.json"
  scaling_md="docs/scaling.md"
  scaling_json="docs/scaling.json"
  quick_flag=()
fi

# The bench starts its own redis-server on a random port and stops it at the end.
"$target/release/botmesh-bench" \
  --botmesh "$target/release/botmesh" \
  --out-md "$md" --out-json "$json" "$@"

# HTTP mesh vs Redis Streams transport, many bots in one process (BENCH_TRANSPORTS=0 skips).
if [ "${BENCH_TRANSPORTS:-1}" != 0 ]; then
  "$target/release/botmesh-bench" transports "${quick_flag[@]}" \
    --out-md "$scaling_md" --out-json "$scaling_json"
fi
