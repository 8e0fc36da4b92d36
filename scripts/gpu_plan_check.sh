#!/usr/bin/env bash
# The plan's calibration on one GPU (issue 43 item 5), under 8 minutes on an H100 or H200; installs nothing.
#   random-weight Llama-3.1-8B and Llama-3.2-1B in bfloat16, KV cache of 640 tokens: the forward of T = 1..9 new
#   tokens (AR step, draft step, verify at K+1), with the kernels a run on this GPU picks, and once more with Pallas;
#   then the Llama-3.1-70B / 3.2-1B plan on this GPU kind fitted to those timings.
# The attention kernels' own check is scripts/gpu_check.sh (a separate 8 minutes).
# Results go to $1, else $OUT, else ./gpu_plan_out: calibration.json (scripts/plan.py --calibration reads it),
# calibration_pallas.json, plan_fitted.txt, env.txt. Usage: bash scripts/gpu_plan_check.sh [OUT_DIR]
# CPU dry run of the same steps with tiny shapes: SSD_PLAN_DRY_RUN=1 bash scripts/gpu_plan_check.sh /tmp/dry
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-gpu_plan_out}}"
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# The 8B in bfloat16 is 16 GB of weights; leave the rest to XLA's temporaries.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}"
DRY="${SSD_PLAN_DRY_RUN:-}"

{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: n/a"
  python -c "import jax; print('jax', jax.__version__, jax.default_backend(), jax.devices())"
} 2>&1 | tee "$OUT_DIR/env.txt"

if [ -z "$DRY" ]; then
  if ! python -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')"; then
    echo "no GPU backend (SSD_PLAN_DRY_RUN=1 runs tiny shapes on CPU)" | tee -a "$OUT_DIR/env.txt"
    exit 1
  fi
  SHAPES=() ; DEVICE=$(python -c "import jax; k = jax.devices()[0].device_kind; print('h200' if 'H200' in k else 'h100-80gb')")
else
  SHAPES=(--tiny --reps 3 --verify-max 3) ; DEVICE=h100-80gb
fi

# 1. The kernels a run picks ('auto': the reference attention on a GPU), about 3 minutes with compiles.
timeout 240 python scripts/dev/plan_calibrate.py "${SHAPES[@]}" --budget-s 180 --out "$OUT_DIR/calibration.json" \
  2>&1 | tee "$OUT_DIR/calibration_log.txt"
cal_rc=${PIPESTATUS[0]}
# 2. The same with the Pallas attention (Triton), about 3 minutes.
timeout 200 python scripts/dev/plan_calibrate.py "${SHAPES[@]}" --attn pallas --budget-s 150 \
  --out "$OUT_DIR/calibration_pallas.json" 2>&1 | tee -a "$OUT_DIR/calibration_log.txt"
pallas_rc=${PIPESTATUS[0]}
# 3. The paper's pair on this GPU kind, fitted to step 1 (analytic: seconds).
timeout 60 python scripts/plan.py --target llama-3.1-70b --draft llama-3.2-1b --target-devices 4 --device "$DEVICE" \
  --calibration "$OUT_DIR/calibration.json" 2>&1 | tee "$OUT_DIR/plan_fitted.txt"
plan_rc=${PIPESTATUS[0]}

echo "calibration exit code: $cal_rc; pallas: $pallas_rc; plan: $plan_rc; results in $OUT_DIR" | tee -a "$OUT_DIR/env.txt"
[ "$cal_rc" -eq 0 ] && [ "$pallas_rc" -eq 0 ]
