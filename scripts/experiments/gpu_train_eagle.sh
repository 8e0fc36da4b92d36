#!/usr/bin/env bash
# Trains the EAGLE draft on one GPU (issue #31), target features computed in memory (no cache). On one H200 the
# target pass over the 2.35M tokens of the corpora took 162 s (float32 at full precision) and a training step of 64
# windows of 512 tokens 0.12 s (270k tokens/s): held-out agreement peaked after ~1,100 steps (36M tokens).
#
#   bash scripts/experiments/gpu_train_eagle.sh TARGET BUDGET_S [OUT_DIR] [extra train_eagle.py options]
#
# TARGET: the target (a name, an ssd-jax checkpoint or the GGUF); BUDGET_S: seconds for the whole run (target load,
# features, compilation, training, the last held-out evaluation and export; give the lease's command limit some
# margin beyond it for the tarball). Writes OUT_DIR (default $OUT, else ./gpu_eagle_out): train.log, env.txt and
# eagle.tgz (the best exported draft; unpack it under checkpoints/). Installs nothing: jax, flax, optax, orbax and
# the gguf reader must be importable (a machine without the last can be given its wheel on PYTHONPATH).
set -uo pipefail
cd "$(dirname "$0")/../.."  # the repository
TARGET="$1"; BUDGET="$2"; shift 2
OUT_DIR="${1:-${OUT:-gpu_eagle_out}}"; [ $# -gt 0 ] && shift
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: n/a"
  python3 -c "import jax, flax, optax, orbax.checkpoint; print('jax', jax.__version__, jax.default_backend(), jax.devices(), 'flax', flax.__version__, 'optax', optax.__version__)"
} 2>&1 | tee "$OUT_DIR/env.txt"
WORK=$(mktemp -d)
C=checkpoints/draft-train-tc  # EAGLE_CORPORA (comma-separated directories) overrides the corpora
CORPORA="${EAGLE_CORPORA:-$C/target_answers_syn,$C/target_answers_1r,$C/target_answers_math1,$C/target_answers_code1,$C/target_answers_inst1,$C/target_answers_qw1,$C/target_answers_qw2,$C/target_answers_5}"
python3 scripts/train_eagle.py --target "$TARGET" --features-in-memory \
  --target-corpus "$CORPORA" \
  --work-dir "$WORK/train" --out "$WORK/eagle-smollm2" --time-budget "$BUDGET" "$@" 2>&1 | tee "$OUT_DIR/train.log"
rc=${PIPESTATUS[0]}
[ -d "$WORK/eagle-smollm2" ] && tar czf "$OUT_DIR/eagle.tgz" -C "$WORK" eagle-smollm2
echo "train_eagle.py exit code $rc" | tee -a "$OUT_DIR/env.txt"
exit $rc
