#!/usr/bin/env bash
# Installs the Debian packages Hermes needs besides its pinned tools, only those missing:
#   - with no argument (`make tools`): bubblewrap (`bwrap`), the sandbox of `code.python`;
#   - with `browser` (`make browser`, which `make test` and `make bench` run): chromium and
#     chromium-driver, the headless browser the web console's tests drive.
# As root with apt-get it installs them; otherwise it says
# what to install and carries on (code.python refuses to run without bwrap, and the console
# tests fail naming the missing browser).
set -euo pipefail
missing=()
if [ "${1:-}" = browser ]; then
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
else
  command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
fi
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
# A string test: without `id` this takes the note's path rather than failing `[ -eq ]`.
if [ "$(id -u 2>/dev/null)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing ${missing[*]} with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  # The package lists may be missing on a fresh machine; refresh them only when needed.
  if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  # Each `if`, so a tool this run did not install never decides the exit status.
  for tool in bwrap chromium chromedriver; do
    if command -v "$tool" >/dev/null 2>&1; then
      "$tool" --version 2>/dev/null | head -n 1 || true
    fi
  done
else
  target=tools
  [ "${1:-}" = browser ] && target=browser
  echo "note: ${missing[*]} not installed: install them as root (apt-get install ${missing[*]})," \
    "then rerun make $target; code.python needs bubblewrap, the console's browser tests need chromium" >&2
fi
