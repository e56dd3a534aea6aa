#!/usr/bin/env bash
# Installs the peers that `make bench-peers` measures Hermes against into <tools>:
# - Redis, from Debian's packages redis-server and redis-tools (the server binary is in
#   redis-tools) and the two libraries they need that the machine lacks (libjemalloc2, liblzf1),
#   each pinned to one version and its .deb to a sha256, fetched with `apt-get download` and
#   unpacked with `dpkg -x` into <tools>/redis: no root needed (but to refresh the package lists),
#   nothing installed system-wide, no service started. <tools>/redis/bin/redis-server and
#   redis-cli are wrappers that point the loader at the unpacked libraries;
# - Celery with redis-py, every wheel pinned by hash (scripts/bench_peers/requirements.txt), into
#   the venv <tools>/peers-venv.
# Each half is skipped when it is already there at its pins; nothing is fetched at run time.
set -euo pipefail
tools="$1"
root="$(cd "$(dirname "$0")/.." && pwd)"

# The versions in bookworm's main pocket, which point releases replace but a security update
# does not (bookworm-security carries a newer redis, and drops each one as the next comes).
redis_version="5:7.0.15-1~deb12u7"
debs=(
  "redis-server=$redis_version 1f43e46f153d1653586e72871dd3e2ea08acba5c3d2b38b02f90d63d16352cac"
  "redis-tools=$redis_version 3c8cd27847c6a06b6f6c29e7415a9057462a89661e3a8e2eb8dd5b2d7830bb40"
  "libjemalloc2=5.3.0-1 a4117c23c5c8acf6c9678a6cb086f000b79476369da7efe8a78a70826956ad3d"
  "liblzf1=3.6-3 9854b0866201b63e04f1e446f45f01ef4a6f72c61f2250b75f944f6046cc7e8c"
)

# need <tool> <what for>: one line naming a missing tool and what needs it, then exit 1.
need() {
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "install-peers: $1 not found, needed $2, then rerun" >&2
    exit 1
  fi
}

install_redis() {
  local dest="$tools/redis"
  local stamp="$dest/.pins"
  local pins
  pins="$(printf '%s\n' "${debs[@]}")"
  if [ "$(cat "$stamp" 2>/dev/null)" = "$pins" ] && "$dest/bin/redis-server" --version >/dev/null 2>&1; then
    return 0
  fi
  # Named before the architecture check, which would blame the machine for a missing dpkg.
  need dpkg "to unpack Redis from Debian's packages: run on Debian 12 (amd64)"
  need apt-get "to download Redis from Debian's packages: run on Debian 12 (amd64)"
  need sha256sum "to check Redis's packages: install it (Debian: apt-get install coreutils)"
  if [ "$(dpkg --print-architecture 2>/dev/null)" != "amd64" ]; then
    echo "install-peers: the Redis packages are pinned for amd64 (Debian 12); this machine is not" >&2
    exit 1
  fi
  echo "installing Redis ${redis_version#*:} from Debian's packages into $dest" >&2
  local work
  work=$(mktemp -d)
  # apt-get downloads as its unprivileged user _apt, which needs to write here.
  if [ "$(id -u)" -eq 0 ] && id _apt >/dev/null 2>&1; then
    chown _apt "$work"
  fi
  local specs=() entry
  for entry in "${debs[@]}"; do
    specs+=("${entry%% *}")
  done
  # The package lists may be missing or stale on a fresh machine (a version they name can have
  # left its pocket since); refresh them once, as root, when the download fails.
  if ! (cd "$work" && apt-get download -qq "${specs[@]}" 2>"$work/apt.err"); then
    if [ "$(id -u)" -eq 0 ]; then
      echo "install-peers: apt-get download failed ($(tr '\n' ' ' <"$work/apt.err")); refreshing the package lists" >&2
      apt-get update -qq
      (cd "$work" && apt-get download -qq "${specs[@]}")
    else
      cat "$work/apt.err" >&2
      echo "install-peers: apt-get download failed; refresh the package lists as root (apt-get update), then rerun" >&2
      rm -rf "$work"
      exit 1
    fi
  fi
  rm -rf "$dest.part"
  mkdir -p "$dest.part/bin"
  local name sha file
  for entry in "${debs[@]}"; do
    name="${entry%%=*}"
    sha="${entry##* }"
    file=$(ls "$work/${name}"_*.deb)
    if ! echo "$sha  $file" | sha256sum --check --status; then
      echo "install-peers: $(basename "$file") does not have the pinned sha256 $sha" >&2
      rm -rf "$work" "$dest.part"
      exit 1
    fi
    dpkg -x "$file" "$dest.part"
  done
  rm -rf "$work"
  local tool
  for tool in redis-server redis-cli; do
    cat >"$dest.part/bin/$tool" <<EOF
#!/bin/sh
# Debian's $tool, unpacked by scripts/install-peers.sh, with the libraries unpacked beside it.
here=\$(dirname "\$(readlink -f "\$0")")/..
LD_LIBRARY_PATH="\$here/usr/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$here/usr/bin/$tool" "\$@"
EOF
    chmod +x "$dest.part/bin/$tool"
  done
  local missing
  missing=$(LD_LIBRARY_PATH="$dest.part/usr/lib/x86_64-linux-gnu" ldd "$dest.part/usr/bin/redis-check-rdb" | grep 'not found' || true)
  if [ -n "$missing" ]; then
    echo "install-peers: redis-server needs libraries this machine lacks:" >&2
    echo "$missing" >&2
    rm -rf "$dest.part"
    exit 1
  fi
  rm -rf "$dest"
  mv "$dest.part" "$dest"
  echo "$pins" >"$stamp"
  "$dest/bin/redis-server" --version
}

install_celery() {
  local venv="$tools/peers-venv"
  local requirements="$root/scripts/bench_peers/requirements.txt"
  local stamp="$venv/.requirements"
  if cmp -s "$requirements" "$stamp" && "$venv/bin/python" -c "import celery, redis" 2>/dev/null; then
    return 0
  fi
  need python3 "for Celery's venv: install it (Debian: apt-get install python3 python3-venv)"
  echo "installing the pinned Celery and redis-py into $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-input --only-binary=:all: \
    --require-hashes -r "$requirements"
  cp "$requirements" "$stamp"
  "$venv/bin/celery" --version
}

mkdir -p "$tools"
install_redis
install_celery
