#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time and prints a summary.
#
#   scripts/fuzz.sh                      # each target 60 s
#   scripts/fuzz.sh --seconds 10 mention # one target, 10 s
#   scripts/fuzz.sh --update-corpus      # also merge what was found into fuzz/corpus (cmin)
#
# Needs cargo-fuzz (installed here if missing) and libFuzzer's -Z flags: the nightly
# toolchain when one is installed, else stable with RUSTC_BOOTSTRAP=1. Not part of
# scripts/test.sh; the committed corpus is replayed there by tests/tests/fuzz_corpus.rs.
# New inputs go to fuzz/target/work-corpus/<target> so the committed corpus only
# changes with --update-corpus. A crash leaves its input in fuzz/artifacts/<target>/;
# copy it to fuzz/regressions/<target>/ once fixed. Exit status 1 if any target crashed.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds=60
update=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --seconds=*) seconds="${1#*=}"; shift ;;
    --update-corpus) update=1; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
case "$seconds" in ''|*[!0-9]*) echo "fuzz.sh: --seconds needs a whole number" >&2; exit 2 ;; esac
if [ ${#targets[@]} -eq 0 ]; then
  targets=(envelope_parse envelope_verify mention feishu_event feishu_decrypt)
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz.sh: installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  fuzz=(cargo +nightly fuzz)
  toolchain=nightly
else
  export RUSTC_BOOTSTRAP=1
  fuzz=(cargo fuzz)
  toolchain="stable with RUSTC_BOOTSTRAP=1"
fi
echo "fuzz.sh: ${#targets[@]} target(s), ${seconds} s each, $toolchain"
"${fuzz[@]}" build

summary=()
failed=0
for t in "${targets[@]}"; do
  work="target/work-corpus/$t"
  mkdir -p "$work" "corpus/$t" "artifacts/$t"
  log="target/fuzz-$t.log"
  before=$(find "artifacts/$t" -type f | wc -l)
  status=ok
  # The work folder comes first: libFuzzer writes new inputs into the first folder.
  if ! "${fuzz[@]}" run "$t" "$work" "corpus/$t" -- \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      >"$log" 2>&1; then
    status=CRASH
    failed=1
  fi
  after=$(find "artifacts/$t" -type f | wc -l)
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1 || true)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || true)
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || true)
  if [ "$update" = 1 ] && [ "$status" = ok ]; then
    cp -n "$work"/* "corpus/$t"/ 2>/dev/null || true
    "${fuzz[@]}" cmin "$t" "corpus/$t" >"target/cmin-$t.log" 2>&1 || echo "fuzz.sh: cmin $t failed (see fuzz/target/cmin-$t.log)"
  fi
  files=$(find "corpus/$t" -type f | wc -l)
  line=$(printf '%-16s %-6s execs=%-10s cov=%-6s ft=%-6s corpus=%-5s new-crashes=%s' \
    "$t" "$status" "${execs:-?}" "${cov:-?}" "${ft:-?}" "$files" "$((after - before))")
  echo "$line"
  if [ "$status" != ok ]; then
    grep -m1 -A3 'panicked at\|ERROR: libFuzzer\|==ERROR' "$log" | sed 's/^/    /' || true
    ls -t "artifacts/$t" | head -3 | sed "s|^|    fuzz/artifacts/$t/|"
  fi
  summary+=("$line")
done

echo
echo "fuzz.sh summary (${seconds} s per target, logs in fuzz/target/fuzz-<target>.log):"
printf '  %s\n' "${summary[@]}"
exit "$failed"
