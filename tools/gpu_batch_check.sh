#!/usr/bin/env bash
# gpu_batch_check.sh — the CUDA backend's batching checks on the GPU machine, in one call, logs into
# a folder: the batch test, the other GPU tests (they run through the batched forward as batches of
# one), compute-sanitizer memcheck and racecheck of the batch test, and the batch benchmark.
#
#   GPU_BINS="gpu_test_batch gpu_test_backend gpu_test_long gpu_test_specialists gpu_test_repro \
#             gpu_test_kernels bench_gpu squad" tools/gpu_run.sh --prepare     HERE (fills .carry/)
#   tools/gpu_batch_check.sh OUTDIR                                           THERE (carry [".carry"])
#
# Steps (STEPS="batch tests memcheck racecheck bench" by default), each bounded by a timeout, the
# timings (ablate, bench) before the slower checks (tests, memcheck, racecheck):
#   batch      gpu_test_batch                                  -> batch.log
#   tests      gpu_test_kernels, gpu_test_backend, gpu_test_specialists, gpu_test_repro, gpu_test_long
#                                                              -> tests.log
#   memcheck   compute-sanitizer memcheck on gpu_test_batch (SQUAD_GPU_TEST_QUICK=1) -> memcheck.log
#   racecheck  compute-sanitizer racecheck on gpu_test_batch (quick)                -> racecheck.log
#   bench      squad synth --preset qwen3.5-0.8b, bench_gpu --batch (N = 1, 4, 16, 64 hits of 32 and
#              128 tokens on one and on N cached 4096-token states)              -> bench_batch.log
#   ablate     (not by default) bench_gpu --batch --ablate: each batch graph (16 x 32 and 16 x 128 hits
#              on one and on 16 cached states, 1 x 128) with one kernel group left out at a time, the
#              restores and the forward's host side; the shares table at the end -> batch_ablate.log;
#              with ABLATE_ENVS="A=1 A=2,B=3 ..." once more per space-separated item, its comma-separated
#              assignments in the environment (experiment switches, docs/cuda.md)
# summary.log lists each step's exit status and time.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARRY=$ROOT/.carry
BIN=$CARRY/bin
OUT=${1:?usage: tools/gpu_batch_check.sh OUTDIR}
mkdir -p "$OUT"
cd "$ROOT"
STEPS=${STEPS:-"batch tests memcheck racecheck bench"}
SUM=$OUT/summary.log
MODEL=${SQUAD_BENCH_MODEL:-/tmp/squad-qwen3.5-0.8b}
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$SUM"; }
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }

CUBLAS_DIR=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13.0/lib64; do
    [ -e "$d/libcublasLt.so.13" ] && CUBLAS_DIR=$d && break
done
if [ -z "$CUBLAS_DIR" ]; then
    CUBLAS_DIR=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null || true)
fi
RUNENV="env LD_LIBRARY_PATH=$CARRY/lib:$CUBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} SQUAD_GEMM_PLANS=$OUT/gemm-plans.txt"

step() { # step NAME TIMEOUT LOGFILE CMD...
    local name=$1 to=$2 lf=$3
    shift 3
    local t0=$(date +%s)
    echo "== $name" >>"$lf"
    timeout "$to" "$@" >>"$lf" 2>&1
    local rc=$?
    log "$name: exit $rc in $(($(date +%s) - t0)) s (log $(basename "$lf"))"
    return $rc
}

log "gpu_batch_check.sh: steps [$STEPS], carried build of $(cat "$CARRY/COMMIT" 2>/dev/null || echo '?')"
if [ ! -x "$BIN/gpu_test_batch" ]; then
    log "no carried gpu_test_batch in $BIN: run the --prepare line in this script's header here and carry .carry"
    exit 2
fi
if has batch; then
    step "gpu_test_batch" 420 "$OUT/batch.log" $RUNENV "$BIN/gpu_test_batch"
fi
if { has bench || has ablate; } && [ ! -e "$MODEL/model.safetensors" ]; then
    step "synth qwen3.5-0.8b" 180 "$OUT/bench_batch.log" $RUNENV "$BIN/squad" synth --preset qwen3.5-0.8b --out "$MODEL"
fi
if has ablate; then
    step "bench_gpu --batch --ablate" 300 "$OUT/batch_ablate.log" $RUNENV "$BIN/bench_gpu" --model "$MODEL" --batch \
        --ablate --reps "${BENCH_REPS:-20}"
    for item in ${ABLATE_ENVS:-}; do
        echo "== ${item//,/ }" >>"$OUT/batch_ablate.log"
        step "bench_gpu --batch --ablate (${item//,/ })" 120 "$OUT/batch_ablate.log" $RUNENV ${item//,/ } "$BIN/bench_gpu" \
            --model "$MODEL" --batch --ablate --reps "${BENCH_REPS:-20}"
    done
fi
if has bench; then
    step "bench_gpu --batch" 480 "$OUT/bench_batch.log" $RUNENV "$BIN/bench_gpu" --model "$MODEL" --batch \
        --reps "${BENCH_REPS:-30}"
fi
if has tests; then
    for t in gpu_test_kernels gpu_test_backend gpu_test_specialists gpu_test_repro gpu_test_long; do
        [ -x "$BIN/$t" ] && step "$t" 480 "$OUT/tests.log" $RUNENV "$BIN/$t"
    done
fi
if has memcheck; then
    step "memcheck gpu_test_batch (quick)" 480 "$OUT/memcheck.log" $RUNENV SQUAD_GPU_TEST_QUICK=1 \
        compute-sanitizer --tool memcheck --leak-check full --error-exitcode 9 "$BIN/gpu_test_batch"
fi
if has racecheck; then
    step "racecheck gpu_test_batch (quick)" 480 "$OUT/racecheck.log" $RUNENV SQUAD_GPU_TEST_QUICK=1 \
        compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 9 "$BIN/gpu_test_batch"
fi
log "done"
exit 0
