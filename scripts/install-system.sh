#!/usr/bin/env bash
# Installs the system packages Hermes needs besides its pinned tools: bubblewrap (`bwrap`), the
# sandbox of the `code.python` tool. It does nothing when `bwrap` is already there. As root with
# apt-get it installs the `bubblewrap` package; otherwise it says what to install and carries on,
# since only `code.python` needs it, and that tool refuses to run without it.
set -euo pipefail
if command -v bwrap >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing bubblewrap (the sandbox of code.python) with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  # The package lists may be missing on a fresh machine; refresh them only when needed.
  if ! apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null 2>&1; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends bubblewrap
  fi
  bwrap --version
else
  echo "note: bubblewrap (bwrap) is not installed, so code.python will refuse to run;" \
    "install the bubblewrap package as root (apt-get install bubblewrap), then rerun make tools" >&2
fi
