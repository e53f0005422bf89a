#!/usr/bin/env bash
# The whole test run: format check, lints, then every unit and end-to-end test.
# End-to-end tests start real nodes on 127.0.0.1 and a scripted LLM; nothing else is contacted.
#
# On a fresh machine it first installs what the tests need:
#   - Debian packages (as root, with apt-get): redis-server, chromium, chromium-driver,
#     fonts-noto-cjk, systemd (systemd-analyze), python3, python3-venv, nodejs and npm;
#     without root or apt-get it stops, naming what is missing;
#   - a Python venv in .venv-test/ with the packages of tests/requirements.txt (pip), whose
#     interpreter the tests find in BOTMESH_TEST_PYTHON;
#   - a real coding agent, @zed-industries/codex-acp (npm, pinned), in .npm-test/, which the
#     tests find in BOTMESH_TEST_CODEX_ACP.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

# --- Debian packages -------------------------------------------------------------------
py_can_venv() { "$1" -c 'import venv, ensurepip' >/dev/null 2>&1; }

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
[ -x "${BOTMESH_CHROMIUM:-/usr/bin/chromium}" ] || need+=(chromium)
[ -x "${BOTMESH_CHROMEDRIVER:-/usr/bin/chromedriver}" ] || need+=(chromium-driver)
# The page test checks that CJK text renders as glyphs, not as empty boxes.
{ command -v fc-list >/dev/null 2>&1 && fc-list :lang=zh | grep -q .; } || need+=(fonts-noto-cjk)
# tests/tests/codex.rs installs a real ACP agent from npm.
command -v npm >/dev/null 2>&1 || need+=(nodejs npm)
# The packaging test checks the systemd unit with systemd-analyze.
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
if ! command -v python3 >/dev/null 2>&1; then
  need+=(python3 python3-venv)
elif ! py_can_venv python3 && ! py_can_venv /usr/bin/python3; then
  need+=(python3-venv)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing ${need[*]} (apt-get)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "test.sh: missing ${need[*]}; the end-to-end tests need them." >&2
    echo "test.sh: install them first (as root): apt-get install -y ${need[*]}" >&2
    exit 1
  fi
fi

# --- Python packages for the tests, in a venv of their own ------------------------------
python=python3
py_can_venv "$python" || python=/usr/bin/python3
venv="$PWD/.venv-test"
requirements=tests/requirements.txt
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c '' >/dev/null 2>&1; then
  rm -rf "$venv"
  "$python" -m venv "$venv"
fi
if ! cmp -s "$requirements" "$venv/requirements.txt"; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
  cp "$requirements" "$venv/requirements.txt"
fi
export BOTMESH_TEST_PYTHON="$venv/bin/python"

# --- A real ACP agent (tests/tests/codex.rs), from npm, in a directory of its own ---------
codex_acp_version=0.16.0
npm_dir="$PWD/.npm-test"
codex_acp="$npm_dir/node_modules/.bin/codex-acp"
codex_acp_installed() {
  [ -x "$codex_acp" ] &&
    grep -q "\"version\": \"$codex_acp_version\"" \
      "$npm_dir/node_modules/@zed-industries/codex-acp/package.json" 2>/dev/null
}
if ! codex_acp_installed; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "test.sh: missing npm (and node); tests/tests/codex.rs runs @zed-industries/codex-acp from npm." >&2
    echo "test.sh: install them first (as root): apt-get install -y nodejs npm" >&2
    exit 1
  fi
  echo "test.sh: installing @zed-industries/codex-acp@$codex_acp_version into .npm-test/ (npm)" >&2
  npm install --prefix "$npm_dir" --no-audit --no-fund --loglevel=error \
    "@zed-industries/codex-acp@$codex_acp_version" >/dev/null
fi
export BOTMESH_TEST_CODEX_ACP="$codex_acp"

# --- Disk -------------------------------------------------------------------------------
# A clean build of every test binary writes about 5 GB under target/ (line tables only, see
# Cargo.toml's [profile.dev]). Say so before the compiler fails on a full disk half-way.
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
probe_dir="$target_dir"
[ -d "$probe_dir" ] || probe_dir="$PWD"
free_kb=$(df -Pk "$probe_dir" 2>/dev/null | awk 'NR == 2 { print $4 }')
if [ -n "$free_kb" ] && [ "$free_kb" -lt $((6 * 1024 * 1024)) ]; then
  echo "test.sh: only $((free_kb / 1024)) MiB free where the build goes ($probe_dir);" \
    "a clean build needs about 5 GiB (an incremental one less). Free space or set CARGO_TARGET_DIR." >&2
fi

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# Every doc link resolves (private items too): a `///` naming a moved or renamed item
# is a doc that no longer matches the code.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --document-private-items --locked --quiet
cargo build --workspace --locked --bins
cargo test --workspace --all-targets --locked "$@"
