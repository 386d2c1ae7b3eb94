#!/usr/bin/env bash
# spec_bench.sh — the specialists' end-to-end figures on the GPU machine (bench/RESULTS.md, "CUDA:
# specialists"), A/B in one call: `squad bench` on the 0.8B preset with two rank-16 specialists on
# every projection of the upper 12 layers, forced to one (e2e), against the trunk alone, each case
# with the switches given (docs/cuda.md, "Switches").
#
#   tools/spec_bench.sh CARRY OUTDIR [ENV ...]
#     CARRY   a carried build's folder (tools/gpu_run.sh --prepare; unpacked, e.g. by its tests step)
#     ENV     extra e2e runs, one per item, its comma-separated assignments in the environment
#             (e.g. SQUAD_GEMM_SM90=0 SQUAD_ATT_SM90=0,SQUAD_GEMM_SM90=0)
# Runs: trunk, e2e, each ENV item, e2e again, trunk again (the repeats show the drift) -> OUTDIR/bench.log.
# SPEC_REPS: timed rows a case (default 10).
set -u
C=${1:?usage: tools/spec_bench.sh CARRY OUTDIR [ENV ...]}
D=${2:?usage: tools/spec_bench.sh CARRY OUTDIR [ENV ...]}
shift 2
case $C in /*) ;; *) C=$PWD/$C ;; esac
mkdir -p "$D"
if [ -e "$C/pack.tar.xz" ] && [ ! -d "$C/bin" ]; then xz -dc "$C/pack.tar.xz" | tar -x -C "$C" || exit 2; fi
export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export SQUAD_GEMM_PLANS=/tmp/spec-bench-gemm-plans.txt
S=$C/bin/squad
M=/tmp/spec-bench-model
SP=/tmp/spec-bench-s16
if [ ! -e "$M/model.safetensors" ]; then
    timeout 120 "$S" synth --preset qwen3.5-0.8b --out "$M" --specialists "$SP" --spec-rank 16 >>"$D/bench.log" 2>&1
fi
run() { # NAME ASSIGNMENTS(comma-separated, or -) ARGS...
    local name=$1 envs=$2
    shift 2
    [ "$envs" = - ] && envs=""
    echo "== $name ${envs//,/ }" >>"$D/bench.log"
    local t0=$(date +%s)
    timeout 150 env ${envs//,/ } "$S" bench --model "$M" --device cuda --reps "${SPEC_REPS:-10}" --state 4096 \
        --suffix 32,128 --lengths 4096 "$@" >>"$D/bench.log" 2>&1
    echo "exit $? in $(($(date +%s) - t0)) s" >>"$D/bench.log"
}
E2E="--specialists $SP --specialist e2e"
run trunk -
run e2e - $E2E
for item in "$@"; do run e2e "$item" $E2E; done
run "e2e again" - $E2E
run "trunk again" -
