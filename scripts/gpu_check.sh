#!/usr/bin/env bash
# GPU check for the attention kernels (issue #6), under 8 minutes on one H200; installs nothing.
#   1. the kernel tests on the GPU: the Triton lowering compiled for real (small shapes, and the @gpu realistic ones);
#   2. scripts/dev/bench_kernels.py: each kernel against the jnp reference at prefix 1k-8k, 24 branches, GQA 9/3 and
#      64/8, bf16, with achieved bandwidth on the prefix read against the GPU's.
# Results go to the directory given as $1, else $OUT, else ./gpu_check_out: gpu_tests.txt, kernel_bench.{json,md}.
# Usage: bash scripts/gpu_check.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-gpu_check_out}}"
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
# Leave memory to Triton's compiler and the reference's dense intermediates.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.8}"

{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: n/a"
  python -c "import jax; print('jax', jax.__version__, jax.default_backend(), jax.devices())"
} 2>&1 | tee "$OUT_DIR/env.txt"

if ! python -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')"; then
  echo "no GPU backend: nothing to check (scripts/dev/bench_kernels.py --cpu-smoke checks the script on CPU)" \
    | tee -a "$OUT_DIR/env.txt"
  exit 1
fi

# 1. Tests (the slow end-to-end SSD is left out: it costs minutes of compiles and tests no GPU-specific path).
timeout 150 python -m pytest -q -rs -m "not slow" tests/test_attention_kernels.py 2>&1 | tee "$OUT_DIR/gpu_tests.txt"
tests_rc=${PIPESTATUS[0]}

# 2. Timings; the script stops starting new cases after --budget-s and writes its files after every case.
timeout 300 python scripts/dev/bench_kernels.py --out "$OUT_DIR" --budget-s 230 2>&1 | tee "$OUT_DIR/bench_log.txt"
bench_rc=${PIPESTATUS[0]}

echo "tests exit code: $tests_rc; bench exit code: $bench_rc; results in $OUT_DIR" | tee -a "$OUT_DIR/env.txt"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
