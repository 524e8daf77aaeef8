#!/bin/bash
# One GPU lease in one call, with JAX alone (no install step, no Ray/MLflow/SQL): the card's facts,
# then benchmarks/gpu_session.py with the next lease's plan (benchmarks/README.md). Run from the
# repository root; extra arguments go to gpu_session.py and override the defaults below.
#
#   OUT=DIR bash benchmarks/gpu_lease.sh                 # results (JSON, log.txt) under DIR
#   PLAN=second BUDGET=300 bash benchmarks/gpu_lease.sh --repeats 20
#   CHECK=full,linformer,performer,rnn,eva,flurka-performer,flurka-rnn,flurka-eva,flash OUT=DIR bash benchmarks/gpu_lease.sh
#
# PYTHON: the interpreter with JAX (default python3). FLAX_WHEEL: a flax >= 0.12 wheel to use
# where the machine's flax is older (installed under /tmp, nothing else touched).
set -o pipefail
PYTHON=${PYTHON:-python3}
# Default OUT: under the card's folder (benchmarks/results/h100/, h200/; "gpu" if nvidia-smi names none).
[ -z "$OUT" ] && CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oiE '\b[a-z][0-9]{2,3}\b' | head -1 | tr '[:upper:]' '[:lower:]')
OUT=${OUT:-benchmarks/results/${CARD:-gpu}/lease-$(date -u +%Y%m%d-%H%M)}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/workers${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.94}
# XLA's GEMM choices on this card (kernel, tiles, split-K), for compiling the same plans without
# it: make aot ARGS="--xla xla_gpu_load_autotune_results_from=$OUT/autotune.textproto ...".
# Tens of thousands of lines: summarise it in the card's NOTES.md, do not commit it.
export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_dump_autotune_results_to=$(cd "$OUT" && pwd)/autotune.textproto"

GPU_QUERY=name,memory.total,clocks.sm,clocks.max.sm,clocks.mem,driver_version,temperature.gpu,power.draw
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=$GPU_QUERY --format=csv | tee "$OUT/card.csv"
if [ -n "$FLAX_WHEEL" ] && ! "$PYTHON" -c "import flax, sys; sys.exit(tuple(map(int, flax.__version__.split('.')[:2])) < (0, 12))"; then
  "$PYTHON" -m pip install -q --no-index --no-deps --target /tmp/flurka-site "$FLAX_WHEEL" &&
    export PYTHONPATH=/tmp/flurka-site:$PYTHONPATH
fi
"$PYTHON" -c "import flax, jax, optax; print('flax', flax.__version__, 'jax', jax.__version__, 'optax', optax.__version__, jax.devices())"

# Points whose compiled step needs more than 92 % of the card's memory are reported OOM unrun.
# Checks against the CPU before the plan (mostly compiling): by default none of CHECK's, since EVA
# and flash passed on the H200 of 2026-12-04 (their checks and the probes took 313 s of its 465 s
# budget); --check-fused still checks the projected FLuRKA variants (flurka-performer, flurka-rnn)
# with the LayerNorm handed over (gpu_session.HANDED_OVER: their gradient kernels) and the fused
# FFN block. CHECK names mechanisms to check as well (each 1-42 s on the H200).
MEMORY=()
if command -v nvidia-smi >/dev/null; then
  MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  MEMORY=(--memory-budget-gb "$(awk -v m="$MIB" 'BEGIN { printf "%d", m * 0.92 / 1024 }')")
fi
# The plan: PLAN, else "h100-second" on any card: what the targets still owe (the first H100
# lease, "targets", did not reach it: benchmarks/results/h100/NOTES.md). The H200's own
# follow-up, "fourth", was overtaken by that lease (its fused FFN and layer forwards lost to
# XLA there, its wide kernel was tuned there); PLAN=fourth still runs it.
PLAN=${PLAN:-h100-second}
"$PYTHON" benchmarks/gpu_session.py --out "$OUT" --plan "$PLAN" --budget-s "${BUDGET:-480}" \
  --check "${CHECK:-}" --check-align 128 --check-fused --tune-fused --probes --profile-steps 2 "${MEMORY[@]}" "$@" \
  2>&1 | tee "$OUT/log.txt"
status=$?
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv
exit $status
