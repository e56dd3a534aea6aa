#!/usr/bin/env bash
# Runs every install script (scripts/install-*.sh) against a PATH that lacks each tool in turn,
# and checks its exit status and what it prints:
# - whatever it installs already there: exit 0, whatever else is missing (but the tool it checks
#   the installed files with, sha256sum, which it then names);
# - work to do and a tool it needs missing: non-zero, and one line naming the tool (not bash's
#   `command not found`);
# - install-system.sh, every subset of bwrap, chromium and chromedriver present, in both modes:
#   apt-get (a fake) asked for exactly the missing packages and the versions printed of the tools
#   present; without root or apt-get a `note:` naming them and exit 0, as documented; a failing
#   apt-get fails the script.
# No network and nothing of this machine's but its basic tools: every case runs under `env -i`
# with PATH a temporary bin dir of symlinks to the tools the script needs and fakes (apt-get,
# dpkg, id, python3 with or without pip, the installed tools). The cases that need a real pinned
# file (grpcurl, the models) use the one in .tools/, or print SKIP without it.
# Prints `ok - ...` or `FAIL - ...` (with the output) per case, then `N passed, M failed`; exits 1
# if any failed. Used by `make install-check` and `make test`.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod_bin=$(type -P chmod)
passed=0
failed=0
why=

# mkbin <case> <tool>...: a fresh $tmp/<case> whose bin dir ($bin) holds symlinks to this
# machine's <tool>s; the case's other files ($case) go beside it.
mkbin() {
  case="$tmp/$1"
  bin="$case/bin"
  shift
  rm -rf "$case"
  mkdir -p "$bin" "$case/home"
  local tool path
  for tool in "$@"; do
    if ! path=$(type -P "$tool"); then
      echo "check.sh: $tool is not on this machine's PATH; the checks need it" >&2
      exit 2
    fi
    ln -s "$path" "$bin/$tool"
  done
}

# fake <file> <bash>: an executable bash script.
fake() {
  mkdir -p "$(dirname "$1")"
  printf '#!%s\n%s\n' "$BASH" "$2" >"$1"
  chmod +x "$1"
}

# needs <missing> <tool>...: adds to $bin each needed <tool> but <missing>. python3 is a fake that
# has pip (and fails anything else: nothing may be fetched), or, when <missing> is pip, one that
# has not; the others are this machine's.
needs() {
  local missing="$1" tool
  shift
  for tool in "$@"; do
    [ "$tool" = "$missing" ] && continue
    case "$tool" in
      pip) ;;
      python3)
        if [ "$missing" = pip ]; then
          fake "$bin/python3" 'if [ "$1" = -m ]; then echo "$0: No module named $2" >&2; exit 1; fi
echo "fake python3: not expected: $*" >&2; exit 1'
        else
          fake "$bin/python3" 'if [ "$*" = "-m pip --version" ]; then echo "pip 23.0.1 (fake)"; exit 0; fi
echo "fake python3: not expected: $*" >&2; exit 1'
        fi
        ;;
      *) ln -s "$(type -P "$tool")" "$bin/$tool" ;;
    esac
  done
}

# run <command>...: from the repo root, with only $bin on PATH and the case's HOME; sets rc, out.
run() {
  out=$(cd "$root" && env -i PATH="$bin" HOME="$case/home" "$@" 2>&1)
  rc=$?
}

want_rc() {
  if [ "$1" = 0 ]; then
    [ "$rc" -eq 0 ] || why+="exit $rc, want 0; "
  else
    [ "$rc" -ne 0 ] || why+="exit 0, want non-zero; "
  fi
}
has() { grep -qF -- "$1" <<<"$out" || why+="output lacks '$1'; "; }
hasnt() { if grep -qF -- "$1" <<<"$out"; then why+="output has '$1'; "; fi; }
silent() { [ -z "$out" ] || why+="output not empty; "; }
# names <tool>: exactly one line says <tool> is missing, and bash never had to.
names() {
  [ "$(grep -cF -- "$1 not found" <<<"$out")" -eq 1 ] || why+="want one line '$1 not found ...'; "
  hasnt "command not found"
}
report() {
  if [ -z "$why" ]; then
    echo "ok - $1"
    passed=$((passed + 1))
  else
    echo "FAIL - $1: $why(exit $rc)"
    [ -n "$out" ] && sed 's/^/    | /' <<<"$out"
    failed=$((failed + 1))
  fi
  why=
}
skip() { echo "SKIP - $1"; }

# --- install-system.sh ---------------------------------------------------------------------------

# write_apt <behaviour>: a fake apt-get in $bin that logs its arguments to $case/apt.log and
# "installs" a package by writing a fake of its command into $bin. ok: every call works; fail:
# every call fails; stale: install fails until update has run (package lists missing).
write_apt() {
  echo "$1" >"$case/apt.mode"
  {
    echo "#!$BASH"
    echo "chmod=$chmod_bin"
    cat <<'EOF'
dir=${0%/*}
echo "$*" >>"$dir/../apt.log"
case $(<"$dir/../apt.mode") in
  fail) echo "E: Unable to locate package ${*: -1}" >&2; exit 100 ;;
  stale)
    if [ "$1" = update ]; then : >"$dir/../apt.updated"; exit 0; fi
    if [ ! -e "$dir/../apt.updated" ]; then echo "E: Unable to locate package ${*: -1}" >&2; exit 100; fi ;;
esac
[ "$1" = install ] || exit 0
shift
for p in "$@"; do
  case $p in
    -*) continue ;;
    bubblewrap) cmd=bwrap ;;
    chromium) cmd=chromium ;;
    chromium-driver) cmd=chromedriver ;;
    *) echo "E: Unable to locate package $p" >&2; exit 100 ;;
  esac
  printf '#!%s\necho "fake-%s 1.0"\n' "$BASH" "$cmd" >"$dir/$cmd"
  "$chmod" +x "$dir/$cmd"
done
EOF
  } >"$bin/apt-get"
  chmod +x "$bin/apt-get"
}

declare -A package=([bwrap]=bubblewrap [chromium]=chromium [chromedriver]=chromium-driver)
all_tools=(bwrap chromium chromedriver)

# system_case <mode: tools|browser> <present tools, bit i = all_tools[i]> <apt-get: ok|fail|stale|none> <uid>
system_case() {
  local mode="$1" mask="$2" apt="$3" uid="$4" i t
  local present=() want=() installed=() args=()
  mkbin system bash head
  fake "$bin/id" "echo $uid"
  for i in 0 1 2; do
    t=${all_tools[$i]}
    if (((mask >> i) & 1)); then
      present+=("$t")
      fake "$bin/$t" "echo \"fake-$t 1.0\""
    fi
  done
  [ "$apt" = none ] || write_apt "$apt"
  local mode_tools=(bwrap)
  if [ "$mode" = browser ]; then
    mode_tools=(chromium chromedriver)
    args=(browser)
  fi
  for t in "${mode_tools[@]}"; do
    if [[ " ${present[*]-} " != *" $t "* ]]; then
      want+=("${package[$t]}")
      installed+=("$t")
    fi
  done
  run "$root/scripts/install-system.sh" ${args[@]+"${args[@]}"}
  local log="$case/apt.log" line="install -y -qq --no-install-recommends ${want[*]-}"
  if [ ${#want[@]} -eq 0 ]; then
    want_rc 0
    silent
    [ ! -e "$log" ] || why+="apt-get was called; "
  elif [ "$uid" != 0 ] || [ "$apt" = none ]; then
    want_rc 0
    has "note: ${want[*]} not installed"
    # The note names the make target that installs what it lists.
    if [ ${#args[@]} -gt 0 ]; then has "rerun make browser"; else has "rerun make tools"; fi
    [ ! -e "$log" ] || why+="apt-get was called; "
    for t in "${all_tools[@]}"; do hasnt "fake-$t"; done
  elif [ "$apt" = fail ]; then
    want_rc nz
  else
    want_rc 0
    has "installing ${want[*]} with apt-get"
    local expect="$line"
    [ "$apt" = stale ] && expect="$line"$'\nupdate -qq\n'"$line"
    [ "$(cat "$log" 2>/dev/null)" = "$expect" ] \
      || why+="apt-get calls '$(tr '\n' '|' <"$log" 2>/dev/null)', want '${expect//$'\n'/|}'; "
    # The version of each tool present after the run, and of no other.
    for t in "${all_tools[@]}"; do
      if [[ " ${present[*]-} ${installed[*]} " == *" $t "* ]]; then has "fake-$t 1.0"; else hasnt "fake-$t"; fi
    done
  fi
  hasnt "command not found"
  report "install-system.sh $mode: present {${present[*]-}}, apt-get $apt, uid $uid"
}

for mode in tools browser; do
  for mask in 0 1 2 3 4 5 6 7; do
    for apt in ok stale fail none; do
      system_case "$mode" "$mask" "$apt" 0
    done
    system_case "$mode" "$mask" ok 1000
  done
done
# Without `id` it cannot tell root: it says what to install, as for a user.
mkbin system bash head
write_apt ok
run "$root/scripts/install-system.sh" browser
want_rc 0
has "note: chromium chromium-driver not installed"
hasnt "command not found"
[ ! -e "$case/apt.log" ] || why+="apt-get was called; "
report "install-system.sh browser: nothing present, no id"

# --- install-tools.sh (nats-server) --------------------------------------------------------------

nats_version=$(sed -n 's/^NATS_SERVER_VERSION := //p' "$root/Makefile")
tools_basics=(bash mkdir dirname chmod mktemp rm)
for missing in python3 pip; do
  mkbin tools "${tools_basics[@]}"
  needs "$missing" python3 pip
  fake "$case/tools/bin/nats-server" "echo 'nats-server: v$nats_version'"
  run "$root/scripts/install-tools.sh" "$case/tools" "$nats_version"
  want_rc 0
  silent
  report "install-tools.sh: nats-server $nats_version installed, no $missing"

  for state in absent older; do
    mkbin tools "${tools_basics[@]}"
    needs "$missing" python3 pip
    [ "$state" = older ] && fake "$case/tools/bin/nats-server" "echo 'nats-server: v2.9.10'"
    run "$root/scripts/install-tools.sh" "$case/tools" "$nats_version"
    want_rc nz
    has "installing nats-server $nats_version"
    names "$missing"
    report "install-tools.sh: nats-server $state, no $missing"
  done
done

# --- install-grpcurl.sh --------------------------------------------------------------------------

grpcurl_sha=$(sed -n 's/^binary_sha256="\(.*\)"$/\1/p' "$root/scripts/install-grpcurl.sh")
real_grpcurl="$root/.tools/bin/grpcurl"
grpcurl_ok=
if [ -x "$real_grpcurl" ] && [ "$(sha256sum "$real_grpcurl" | cut -d' ' -f1)" = "$grpcurl_sha" ]; then
  grpcurl_ok=1
fi
grpcurl_basics=(bash mkdir mktemp rm uname cp chmod mv)
grpcurl_needs=(python3 pip sha256sum tar gzip)
for missing in "${grpcurl_needs[@]}"; do
  if [ -n "$grpcurl_ok" ]; then
    mkbin grpcurl "${grpcurl_basics[@]}"
    needs "$missing" "${grpcurl_needs[@]}"
    mkdir -p "$case/tools/bin"
    ln -s "$real_grpcurl" "$case/tools/bin/grpcurl"
    run "$root/scripts/install-grpcurl.sh" "$case/tools"
    if [ "$missing" = sha256sum ]; then
      # It cannot tell the installed binary is the pinned one.
      want_rc nz
      names sha256sum
    else
      want_rc 0
      silent
    fi
    report "install-grpcurl.sh: pinned grpcurl installed, no $missing"
  else
    skip "install-grpcurl.sh: pinned grpcurl installed, no $missing (no pinned .tools/bin/grpcurl here)"
  fi

  for state in absent other; do
    if [ "$(uname -m)" != x86_64 ]; then
      skip "install-grpcurl.sh: grpcurl $state, no $missing (the pinned binary is x86_64 only)"
      continue
    fi
    mkbin grpcurl "${grpcurl_basics[@]}"
    needs "$missing" "${grpcurl_needs[@]}"
    [ "$state" = other ] && fake "$case/tools/bin/grpcurl" "echo 'grpcurl v1.8.9'"
    run "$root/scripts/install-grpcurl.sh" "$case/tools"
    want_rc nz
    names "$missing"
    report "install-grpcurl.sh: grpcurl $state, no $missing"
  done
done

# --- install-model.sh ----------------------------------------------------------------------------

models="$root/.tools/models"
model_basics=(bash dirname mkdir cut rm mktemp cat mv ls)
model_needs=(python3 pip sha256sum)
# link_model <name> <dir>: symlinks the installed files of <name> into <dir> (one by one, so a
# mismatch deletes a link, never the file); fails when they are not there.
link_model() {
  local f files=()
  case "$1" in
    smollm2) files=(SmolLM2-135M-Instruct.Q4_1.gguf) ;;
    qwen-0.5b) files=(Qwen2.5-Coder-0.5B-Instruct.gguf) ;;
    minilm) files=(all-MiniLM-L6-v2/config.json all-MiniLM-L6-v2/tokenizer.json all-MiniLM-L6-v2/model.safetensors) ;;
  esac
  for f in "${files[@]}"; do
    [ -s "$models/$f" ] || return 1
    mkdir -p "$(dirname "$2/$f")"
    ln -s "$models/$f" "$2/$f"
  done
}
for missing in "${model_needs[@]}"; do
  # Hashing the 491 MB Qwen takes a while: every model once, then SmolLM2 alone.
  names_installed=(smollm2)
  [ "$missing" = python3 ] && names_installed=(smollm2 minilm qwen-0.5b)
  for name in "${names_installed[@]}"; do
    mkbin model "${model_basics[@]}"
    needs "$missing" "${model_needs[@]}"
    if ! link_model "$name" "$case/models"; then
      skip "install-model.sh: $name installed, no $missing (not installed in .tools/models here)"
      continue
    fi
    run "$root/scripts/install-model.sh" "$case/models" "$name"
    if [ "$missing" = sha256sum ]; then
      want_rc nz
      names sha256sum
    else
      want_rc 0
      hasnt "not found"
      hasnt "mismatch"
    fi
    report "install-model.sh: $name installed, no $missing"
  done
  for name in smollm2 minilm qwen-0.5b; do
    mkbin model "${model_basics[@]}"
    needs "$missing" "${model_needs[@]}"
    run "$root/scripts/install-model.sh" "$case/models" "$name"
    want_rc nz
    names "$missing"
    report "install-model.sh: $name absent, no $missing"
  done
done

# --- install-peers.sh (Redis, Celery) ------------------------------------------------------------

peers_basics=(bash dirname cat mkdir cmp rm mktemp)
peers_needs=(dpkg apt-get sha256sum python3)
# The pins as the script writes them to <tools>/redis/.pins.
pins=$(bash -c "$(sed -n '/^redis_version=/,/^)$/p' "$root/scripts/install-peers.sh")"$'\nprintf "%s\\n" "${debs[@]}"')
# peers_bin <missing>: the basics, a fake id (not root), and the needs but <missing>: dpkg says
# amd64; apt-get, which no case should reach, fails.
peers_bin() {
  mkbin peers "${peers_basics[@]}"
  fake "$bin/id" 'if [ "${1-}" = -u ]; then echo 1000; else exit 1; fi'
  local tool
  for tool in "${peers_needs[@]}"; do
    [ "$tool" = "$1" ] && continue
    case "$tool" in
      dpkg) fake "$bin/dpkg" 'echo amd64' ;;
      apt-get) fake "$bin/apt-get" 'echo "fake apt-get: not expected: $*" >&2; exit 100' ;;
      python3) fake "$bin/python3" 'echo "fake python3: not expected: $*" >&2; exit 1' ;;
      *) ln -s "$(type -P "$tool")" "$bin/$tool" ;;
    esac
  done
}
redis_installed() {
  mkdir -p "$case/tools/redis"
  printf '%s\n' "$pins" >"$case/tools/redis/.pins"
  fake "$case/tools/redis/bin/redis-server" "echo 'Redis server v=7.0.15'"
}
celery_installed() {
  mkdir -p "$case/tools/peers-venv"
  cp "$root/scripts/bench_peers/requirements.txt" "$case/tools/peers-venv/.requirements"
  fake "$case/tools/peers-venv/bin/python" 'exit 0'
}
for missing in "${peers_needs[@]}"; do
  peers_bin "$missing"
  redis_installed
  celery_installed
  run "$root/scripts/install-peers.sh" "$case/tools"
  want_rc 0
  silent
  report "install-peers.sh: Redis and Celery installed, no $missing"

  peers_bin "$missing"
  if [ "$missing" = python3 ]; then
    redis_installed
    what="Celery absent"
  else
    celery_installed
    what="Redis absent"
  fi
  run "$root/scripts/install-peers.sh" "$case/tools"
  want_rc nz
  names "$missing"
  report "install-peers.sh: $what, no $missing"
done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
