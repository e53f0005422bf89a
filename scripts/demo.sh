#!/usr/bin/env bash
# Starts the example mesh of peers.toml: three bots on this machine, each with its page.
# Generates the mesh secret into .demo/ (ignored by git) on first run. Ctrl-C stops them all.
set -euo pipefail
cd "$(dirname "$0")/.."
config="${BOTMESH_CONFIG:-peers.toml}"

echo "building botmesh…"
cargo build -q -p botmesh
bin=target/debug/botmesh

mkdir -p .demo
if [ ! -s .demo/mesh.secret ]; then
  "$bin" keygen --secret --private-out .demo/mesh.secret
fi

bots=$(sed -n 's/^name = "\(.*\)"/\1/p' "$config")
pids=()
stop() {
  echo
  echo "stopping…"
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait || true
  exit 0
}
trap stop INT TERM

for bot in $bots; do
  "$bin" run --bot "$bot" --config "$config" >".demo/$bot.log" 2>&1 &
  pids+=($!)
done

# Wait until every node answers, or show why it did not.
for bot in $bots; do
  api=$(awk -v b="$bot" '$0 ~ "^name = \""b"\"" {f=1} f && /^api = / {gsub(/"/,"",$3); print $3; exit}' "$config")
  ok=""
  for _ in $(seq 1 100); do
    if curl -fsS "http://$api/healthz" >/dev/null 2>&1; then ok=1; break; fi
    sleep 0.1
  done
  if [ -z "$ok" ]; then
    echo "$bot did not start; its log (.demo/$bot.log):" >&2
    tail -n 20 ".demo/$bot.log" >&2
    stop
  fi
  printf '  %-8s page: http://%s/\n' "$bot" "$api"
done
echo
echo "Open a page, post a message (try \"@小八 帮我读一下这篇论文\" or \"any security concerns with this PR?\")."
echo "Logs: .demo/<bot>.log   Transcripts: .demo/data/<bot>/transcripts/   Ctrl-C stops all bots."
wait
