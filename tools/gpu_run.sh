#!/usr/bin/env bash
# gpu_run.sh — the CUDA backend's build, tests, sanitizers and benchmark on the GPU machine, in one
# call, logs into a folder.
#
#   tools/gpu_run.sh --prepare     HERE (no GPU needed): builds build-gpu/ (Release, sm_90 + PTX) and
#                                  fills .carry/ with the binaries and the shared libraries the GPU
#                                  machine lacks (jansson, PCRE2, utf8proc, libmicrohttpd and theirs).
#   tools/gpu_run.sh --prepare-fla GITDIR   HERE: .fla/ for the hf_fla step (below).
#   tools/gpu_run.sh OUTDIR        THERE (the run tool, carry [".carry"]): runs everything below and
#                                  writes at most 8 logs into OUTDIR.
# The run tool brings back at most 8 files from its $OUT: with more steps, or several OUTDIRs in one
# call, set PACK_LOGS=1 (each OUTDIR comes back as one OUTDIR.tgz; a later invocation on the same
# OUTDIR as OUTDIR.2.tgz, .3 ...).
# GPU_CARRY=.carry-NAME (both sides) keeps a second carried build beside .carry (a branch's, say), so
# one call can run two builds (an A/B: their bench steps alternated A B A B, compared by
# tools/bench_ab.py). --prepare packs the folder's binaries, libraries and tokenizer into
# one xz archive, unpacked there before the steps: the binaries share their CUDA code (an sm_90a
# cubin each, ~14 MB), so nine of them travel as a few MB instead of ~120 (the run tool carries 64).
#
# Why carry binaries: the GPU machine has CUDA 13 and Python but not the Debian -dev packages the
# build needs (pkg-config, jansson, PCRE2, utf8proc, libmicrohttpd), and builds there cost device
# time. cuBLASLt comes from the machine's CUDA (or its pip nvidia-cublas) at run time.
#
# Steps there, in this order (STEPS="env tests repro profile bench hf memcheck racecheck" by default; each
# bounded by a timeout):
#   env        GPU, driver, libraries found                       -> summary.log
#   tests      gpu_test_kernels, gpu_test_backend, gpu_test_specialists, gpu_test_batch (batched rows
#              against the same rows alone and against the CPU)
#                                                  -> test_kernels.log, test_backend.log, test_specialists.log,
#                                                     test_batch.log
#   repro      gpu_test_repro: the same rows bit for bit in two processes through the GEMM plan file
#              (it sets its own SQUAD_GEMM_PLANS)                  -> test_repro.log
#   memcheck   compute-sanitizer memcheck on gpu_test_kernels, gpu_test_backend, gpu_test_batch and
#              gpu_test_specialists' LoRA kernels (SQUAD_GPU_TEST_QUICK=1: no 0.8B-size GEMM cases,
#              fewer rows) -> memcheck.log
#   racecheck  compute-sanitizer racecheck on gpu_test_kernels, gpu_test_batch's batched kernels and
#              gpu_test_specialists' LoRA kernels (quick) -> racecheck.log
#   profile    ncu (--clock-control none) kernel durations of one cold 2048-token row and one
#              4096+128 hit on the 0.8B preset (graph nodes, so tuned GEMMs: each row runs once
#              without ncu first, so the tuning never times its candidates under ncu), summed per kernel
#              (tools/ncu_summary.py) -> profile.log. ncu flushes the caches before each kernel
#              (NCU_CACHE=all, the default, comparable with earlier profiles), which makes short
#              kernels that read what the previous one wrote look slower than in the graph;
#              NCU_CACHE=none keeps the caches as they are
#   kprofile   (not by default) where chosen kernels' warps wait: for each row of KPROFILE_CASES
#              (hit:128; cold:N, hit:Q, or batch:NxQ for a batched step of N Q-token hits), run once
#              without ncu (tuning), then one launch (the KPROFILE_SKIP + 1th, 5th)
#              of each kernel of KPROFILE_KERNELS (name regexes; the GDN and attention kernels) under
#              ncu with source counters; tools/ncu_stalls.py's phases and each kernel's duration,
#              registers, occupancy -> kprofile.log, the SASS pages and details -> kprofile.tgz
#   bench      squad synth --preset qwen3.5-0.8b (on the machine), bench_gpu -> bench.log; with
#              BENCH_ENVS="A=1 A=2,B=3 ..." also one more bench_gpu run per space-separated item, its
#              comma-separated assignments in the environment (e.g. SQUAD_ATT_SM90=0 SQUAD_GEMM_SM90=0: the
#              switches of docs/cuda.md's "Switches") -> bench_ab.log
#   batch      (not by default) bench_gpu --batch: N = 1, 4, 16, 64 concurrent hits of 32 and 128 tokens
#              on one and on N cached 4096-token states, one batched forward each -> batch.log; with
#              BATCH_ABLATE=1 also bench_gpu --batch --ablate (each batch graph with one kernel group
#              left out at a time, the restores and the host side) -> batch_ablate.log
#   ablate     (not by default) bench_gpu --ablate: each chunk graph with one kernel group left out at a
#              time (ABLATE_ENVS as BENCH_ENVS) -> ablate.log
#   gemm       (not by default) the 0.8B projections timed one by one: tuned and untuned cuBLASLt,
#              weights from HBM (SQUAD_GEMM_BENCH=1 gpu_test_kernels) -> gemm.log
#   gemmtest   (not by default) gpu_test_gemm: every configuration of the sm_90a projection kernel
#              against a float64 reference on the 0.8B shapes, then each one's time -> gemmtest.log
#   gemmprobe  (not by default) the sm_90a projection kernel's decomposition probe: its variants
#              with later stages left out, and candidate changes, timed beside it at M = 32 and 128
#              (SQUAD_GEMM_PROBE=1 gpu_test_gemm; docs/cuda.md) -> gemmprobe.log
#   tiers      (not by default) gpu_test_tiers: the host tier's demote -> promote equality on the demo
#              preset, and the restore of a 4,096-token 0.8B state from host memory against its
#              recompute (the 0.8B preset synthesized as for bench) -> test_tiers.log
#   tierbench  (not by default) tools/tier_bench.sh with --device cuda on the 0.8B preset -> tierbench.log:
#              the agent trace through a device budget a quarter of its working set without and with
#              the host tier (requests/s, hit rate, demotions / promotions), and a restart mid-trace
#              without and with --cache-dir (time to /ready, hit rate of the rows after it); ~4 minutes
#   long       (not by default) test_long --backend cuda: long rows on the tiny presets, CUDA against the
#              CPU, K / V growth with and without precaptured graphs, the max_tokens limit, cached =
#              uncached -> test_long.log
#   longbench  (not by default) bench_gpu --long on the 0.8B preset: cold 32768 / 65536 / 131072 and
#              128-token hits on those states, with the device memory in use -> long.log
#              (its own step, so each command stays within the run tool's limit)
# Everything runs at the default precision (bf16) unless it says otherwise (bench_gpu also times one
# row of each case in exact). The GEMM plans the tuning chooses go to $OUT/gemm-plans.txt
# (SQUAD_GEMM_PLANS), so a run starts untuned and its choices come back with the logs.
#   hf         tools/hf_timing.py: transformers on the same weights and rows -> hf.log
#   hf_fla     (not by default) the same with flash-linear-attention on the Python path and each cold
#              forward captured as one CUDA graph: the earlier runtime's setup. Needs .fla/ (a copy of
#              fla's `fla` package + a dist-info so transformers sees it; git-ignored, never committed)
#              carried: carry [".carry", ".fla"] -> hf_fla.log
#   serve      (not by default) tools/server_gpu_check.sh: a 3-question decision request on a cached
#              4096-token state, client time against the engine's -> serve.log
#   serveload  (not by default) tools/bench_server.sh with --device cuda -> serveload.log: the
#              agent trace per concurrency level, the trace at concurrency 32 batched (the default
#              --max-rows) against --max-rows 1, memo-answered requests; BATCH_ONLY=1 in the
#              environment: only the batched against one-at-a-time comparison (BATCH_LEVEL, BATCH_ROWS
#              as tools/bench_server.sh reads them)
#   hftrace    (not by default, after serveload) tools/hf_trace.py: the trace's rows through transformers +
#              flash-linear-attention (.fla carried) with a prefix cache, one row at a time -> hf_trace.log
#   spec       (not by default) tools/spec_bench.sh: the specialists against the trunk end to end on
#              the 0.8B preset (SPEC_ENVS="A=1 A=2,B=3 ...": one more e2e run per item, as BENCH_ENVS)
#              -> spec/bench.log
#   specfix    (not by default) tools/make_specialist_fixtures.py -> specfix.tgz, specfix.log
#   layers     tools/hf_layers.py: transformers' fp32 residual stream per layer for one row
#              (.carry/q08_row.jsonl, when carried) -> hf_layers.json
#   vision     (not by default) gpu_test_vision (the tower against the CPU's fp32 tower on tiny-vl, its
#              attention kernel, image chunks: positions and image rows) -> test_vision.log; then
#              squad synth --preset qwen3.5-0.8b --vision (on the machine, $VISION_MODEL) and
#              bench_vision: the tower on a 1920x1080 screenshot (grid 1x68x120), p50 of
#              ${VISION_REPS:-20} runs, whole call and device part -> vision.log; VISION_SANITIZE=1 also
#              compute-sanitizer memcheck and racecheck on gpu_test_vision (quick) -> vision_sanitize.log;
#              VISION_ENVS="A=1 B=2,C=3 ...": bench_vision once more per item, with its assignments set;
#              and test_vision_rows --backend cuda (the fixture rows with images against transformers,
#              cached = uncached, the encoder cache) -> test_vision_rows.log
#   screenshot (not by default) bench_image (the image processor on 1..16 threads), then bench_screenshot on $VISION_MODEL with the 1920x1080 fixture
#              screenshot: decode, a cold screenshot row (image + 300 tokens + 3 questions), the same
#              after its state was evicted (encoder hit) and a follow-up question -> screenshot.log;
#              with .fla carried, tools/hf_vision_timing.py runs the same rows through transformers +
#              flash-linear-attention -> hf_vision.log
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARRY=${GPU_CARRY:-.carry}
case $CARRY in /*) ;; *) CARRY=$ROOT/$CARRY ;; esac
BINS=${GPU_BINS:-"squad gpu_test_kernels gpu_test_backend gpu_test_specialists gpu_test_batch gpu_test_repro gpu_test_tiers gpu_test_vision gpu_test_gemm test_long test_vision_rows bench_gpu bench_server bench_vision bench_screenshot bench_image"}
# the build folder --prepare fills (GPU_BUILD=build reuses the Makefile's build when it has CUDA)
GPU_BUILD=${GPU_BUILD:-build-gpu}

if [ "${1:-}" = "--prepare-fla" ]; then
    # HERE: .fla/ from a fetched flash-linear-attention repository (its git directory, e.g. the
    # workplace's fetch of github:fla-org/flash-linear-attention): the `fla` package and a minimal
    # dist-info, so transformers' version check finds it on PYTHONPATH. Git-ignored; never committed.
    set -e
    GITDIR=${2:?usage: tools/gpu_run.sh --prepare-fla FLA_GIT_DIR}
    rm -rf "$ROOT/.fla"
    mkdir -p "$ROOT/.fla"
    git --git-dir="$GITDIR" archive HEAD fla | tar -x -C "$ROOT/.fla"
    ver=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$ROOT/.fla/fla/__init__.py")
    di="$ROOT/.fla/flash_linear_attention-$ver.dist-info"
    mkdir -p "$di"
    printf 'Metadata-Version: 2.1\nName: flash-linear-attention\nVersion: %s\n' "$ver" >"$di/METADATA"
    echo fla >"$di/top_level.txt"
    : >"$di/RECORD"
    git --git-dir="$GITDIR" rev-parse HEAD >"$ROOT/.fla/COMMIT"
    du -sh "$ROOT/.fla"
    exit 0
fi

if [ "${1:-}" = "--prepare" ]; then
    set -e
    cd "$ROOT"
    cmake -S . -B "$GPU_BUILD" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_ARCHITECTURES=90-real;90-virtual" >/dev/null
    cmake --build "$GPU_BUILD" -j2 --target $BINS
    rm -rf "$CARRY"
    mkdir -p "$CARRY/bin" "$CARRY/lib"
    for b in $BINS; do cp "$GPU_BUILD/$b" "$CARRY/bin/"; done
    # every shared library the binaries need except glibc, libstdc++ / libgcc and CUDA's own
    for b in $BINS; do ldd "$GPU_BUILD/$b"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
        grep -Ev '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|libcublas|libcudart' |
        while read -r lib; do cp -L "$lib" "$CARRY/lib/"; done
    # libmicrohttpd's own dependencies (gnutls and friends) for the squad binary
    for l in "$CARRY"/lib/*.so*; do ldd "$l"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
        grep -Ev '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
        while read -r lib; do [ -e "$CARRY/lib/$(basename "$lib")" ] || cp -L "$lib" "$CARRY/lib/"; done
    # the real Qwen tokenizer for the server steps (git-ignored test data, fetched by make)
    cp third_party/qwen3/tokenizer.json "$CARRY/tokenizer.json"
    git rev-parse HEAD >"$CARRY/COMMIT"
    ls "$CARRY/lib"
    (cd "$CARRY" && strip bin/* && tar -cf - bin lib tokenizer.json | xz -9 -T2 >pack.tar.xz && rm -rf bin lib tokenizer.json)
    du -sh "$CARRY"
    exit 0
fi

OUT=${1:?usage: tools/gpu_run.sh OUTDIR | --prepare}
mkdir -p "$OUT"
cd "$ROOT"
STEPS=${STEPS:-"env tests repro profile bench hf memcheck racecheck"}
SUM=$OUT/summary.log
BIN=$CARRY/bin
MODEL=${SQUAD_BENCH_MODEL:-/tmp/squad-qwen3.5-0.8b}
VISION_MODEL=${SQUAD_VISION_MODEL:-/tmp/squad-qwen3.5-0.8b-vl}
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$SUM"; }
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }

# cuBLASLt: the machine's CUDA, else the pip wheel's
CUBLAS_DIR=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13.0/lib64; do
    [ -e "$d/libcublasLt.so.13" ] && CUBLAS_DIR=$d && break
done
if [ -z "$CUBLAS_DIR" ]; then
    CUBLAS_DIR=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null || true)
fi
# only our binaries get the carried libraries (python keeps its own)
RUNENV="env LD_LIBRARY_PATH=$CARRY/lib:$CUBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} SQUAD_GEMM_PLANS=$OUT/gemm-plans.txt"

step() { # step NAME TIMEOUT LOGFILE CMD...
    local name=$1 to=$2 lf=$3
    shift 3
    local t0=$(date +%s)
    timeout "$to" "$@" >>"$lf" 2>&1
    local rc=$?
    log "$name: exit $rc in $(($(date +%s) - t0)) s (log $(basename "$lf"))"
    return $rc
}

if [ -e "$CARRY/pack.tar.xz" ] && [ ! -d "$BIN" ]; then
    xz -dc "$CARRY/pack.tar.xz" | tar -x -C "$CARRY" || { log "could not unpack $CARRY/pack.tar.xz"; exit 2; }
fi
log "gpu_run.sh: steps [$STEPS], carried build of $(cat "$CARRY/COMMIT" 2>/dev/null || echo '?'), tree $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
if has env; then
    { nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv; uname -r
      echo "cuBLASLt dir: $CUBLAS_DIR"; ls -la "$BIN" 2>&1; $RUNENV ldd "$BIN/gpu_test_backend" 2>&1 | grep -E "not found|cublas|jansson"
      which compute-sanitizer nvcc ncu python3 2>&1; } >>"$SUM" 2>&1
fi
if [ -z "$(ls -A "$BIN" 2>/dev/null)" ]; then
    log "no carried binaries in $BIN: run tools/gpu_run.sh --prepare here and carry .carry"
    exit 2
fi

if has tests; then
    step "gpu_test_kernels" 240 "$OUT/test_kernels.log" $RUNENV "$BIN/gpu_test_kernels"
    step "gpu_test_backend" 420 "$OUT/test_backend.log" $RUNENV "$BIN/gpu_test_backend"
    step "gpu_test_specialists" 300 "$OUT/test_specialists.log" $RUNENV "$BIN/gpu_test_specialists"
    step "gpu_test_batch" 420 "$OUT/test_batch.log" $RUNENV "$BIN/gpu_test_batch"
fi
if has repro; then
    step "gpu_test_repro" 300 "$OUT/test_repro.log" $RUNENV "$BIN/gpu_test_repro"
fi
if has vision; then
    step "gpu_test_vision" 300 "$OUT/test_vision.log" $RUNENV "$BIN/gpu_test_vision"
    if [ ! -e "$VISION_MODEL/model.safetensors" ]; then
        step "synth qwen3.5-0.8b --vision" 240 "$OUT/vision.log" $RUNENV "$BIN/squad" synth --preset qwen3.5-0.8b --vision \
            --out "$VISION_MODEL"
    fi
    step "bench_vision" 300 "$OUT/vision.log" $RUNENV "$BIN/bench_vision" --model "$VISION_MODEL" --reps "${VISION_REPS:-20}"
    for item in ${VISION_ENVS:-}; do # the same once more per item, its comma-separated assignments set (an A/B)
        # shellcheck disable=SC2086
        step "bench_vision $item" 300 "$OUT/vision.log" $RUNENV ${item//,/ } "$BIN/bench_vision" \
            --model "$VISION_MODEL" --reps "${VISION_REPS:-20}"
    done
    # the fixture rows were made on a tiny-vl with Qwen3's tokenizer (git-ignored test data)
    mkdir -p third_party/qwen3 && cp --update=none "$CARRY/tokenizer.json" third_party/qwen3/tokenizer.json
    step "test_vision_rows --backend cuda" 300 "$OUT/test_vision_rows.log" $RUNENV "$BIN/test_vision_rows" --backend cuda
    if [ "${VISION_SANITIZE:-0}" = 1 ]; then
        step "memcheck gpu_test_vision (quick)" 300 "$OUT/vision_sanitize.log" $RUNENV SQUAD_GPU_TEST_QUICK=1 \
            compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/gpu_test_vision"
        step "racecheck gpu_test_vision (quick)" 300 "$OUT/vision_sanitize.log" $RUNENV SQUAD_GPU_TEST_QUICK=1 \
            compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 9 "$BIN/gpu_test_vision"
    fi
fi
if has screenshot; then
    if [ ! -e "$VISION_MODEL/model.safetensors" ]; then
        step "synth qwen3.5-0.8b --vision" 240 "$OUT/screenshot.log" $RUNENV "$BIN/squad" synth --preset qwen3.5-0.8b --vision \
            --out "$VISION_MODEL"
    fi
    step "bench_image" 120 "$OUT/screenshot.log" $RUNENV "$BIN/bench_image" --threads 1,2,4,8,16 --reps 5
    step "bench_screenshot" 300 "$OUT/screenshot.log" $RUNENV "$BIN/bench_screenshot" --model "$VISION_MODEL" --device cuda \
        --image tests/fixtures/images/ui_1920x1080.png --reps "${VISION_REPS:-20}" --rows-out /tmp/screenshot_rows.jsonl
    if [ -d "$ROOT/.fla/fla" ] && [ -e /tmp/screenshot_rows.jsonl ]; then
        step "hf_vision_timing (flash-linear-attention)" 400 "$OUT/hf_vision.log" env PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT/.fla" \
            python3 tools/hf_vision_timing.py --model "$VISION_MODEL" --rows /tmp/screenshot_rows.jsonl --reps "${HF_REPS:-10}"
    fi
fi
BW=4300
TF=790
if { has profile || has kprofile || has bench || has batch || has ablate || has longbench || has tiers; } &&
    [ ! -e "$MODEL/model.safetensors" ]; then
    step "synth qwen3.5-0.8b" 180 "$OUT/bench.log" $RUNENV "$BIN/squad" synth --preset qwen3.5-0.8b --out "$MODEL"
fi
if has tiers; then
    step "gpu_test_tiers" 300 "$OUT/test_tiers.log" $RUNENV SQUAD_TIERS_MODEL="$MODEL" "$BIN/gpu_test_tiers"
fi
if has profile; then
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    for c in ${PROFILE_CASES:-cold:2048 hit:128}; do
        f=/tmp/ncu_${c/:/_}.log
        # the GEMM tuning times its candidates at a shape's first use: under ncu (every kernel
        # serialized and replayed) it picks differently, and the plans it wrote would be the later
        # steps' (a bench after such a profile measured hit 4096+128 at 1.95 ms against 1.69). So the
        # row runs once without ncu first: the profile sees the plans the bench uses.
        step "tune $c" 120 "${PROFILE_LOG:-$OUT/profile.log}" $RUNENV "$BIN/bench_gpu" --model "$MODEL" --profile "$c"
        step "ncu $c" 240 "${PROFILE_LOG:-$OUT/profile.log}" $RUNENV "$NCU" --clock-control none \
            --cache-control "${NCU_CACHE:-all}" \
            --profile-from-start off --metrics gpu__time_duration.sum --csv --log-file "$f" \
            "$BIN/bench_gpu" --model "$MODEL" --profile "$c"
        python3 tools/ncu_summary.py "$f" "$c" >>"${PROFILE_LOG:-$OUT/profile.log}" 2>&1
    done
fi
if has kprofile; then
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    KP=/tmp/kprofile
    mkdir -p "$KP"
    for c in ${KPROFILE_CASES:-hit:128}; do
        step "tune $c" 120 "$OUT/kprofile.log" $RUNENV "$BIN/bench_gpu" --model "$MODEL" --profile "$c"
        for k in ${KPROFILE_KERNELS:-gdn_conv gdn_prep gdn_scan gdn_out attn_prep attn_fwd attn_combine}; do
            n=${c/:/_}_$k
            step "ncu source counters $c $k" 240 "$OUT/kprofile.log" $RUNENV "$NCU" --clock-control none \
                --cache-control none --profile-from-start off -k "regex:$k" --launch-skip "${KPROFILE_SKIP:-4}" \
                --launch-count 1 --section SourceCounters --section WarpStateStats --section LaunchStats \
                --section Occupancy --section SpeedOfLight -f -o "$KP/$n" "$BIN/bench_gpu" --model "$MODEL" --profile "$c"
            "$NCU" -i "$KP/$n.ncu-rep" --page source --csv --print-source sass >"$KP/$n.sass.csv" 2>&1
            "$NCU" -i "$KP/$n.ncu-rep" --page details >"$KP/$n.details.txt" 2>&1
            grep -E '^ +(Duration|Registers Per Thread|Achieved Occupancy|Block Size|Grid Size) ' "$KP/$n.details.txt" \
                >>"$OUT/kprofile.log"
            python3 tools/ncu_stalls.py "$KP/$n.sass.csv" "$c $k" >>"$OUT/kprofile.log" 2>&1
        done
    done
    tar czf "$OUT/kprofile.tgz" -C "$KP" --exclude='*.ncu-rep' . # the SASS pages and details
fi
if has bench; then
    if python3 - >"$OUT/ceil.txt" 2>>"$OUT/bench.log" <<'EOF'
import torch
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
torch.cuda.synchronize(); s.record()
for _ in range(10): y.copy_(x)
e.record(); torch.cuda.synchronize(); bw = 2 * (1 << 30) * 10 / (s.elapsed_time(e) * 1e-3) / 1e9
del x, y
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
for _ in range(3): a @ b
torch.cuda.synchronize(); s.record()
for _ in range(10): a @ b
e.record(); torch.cuda.synchronize(); tf = 2 * 8192 ** 3 * 10 / (s.elapsed_time(e) * 1e-3) / 1e12
print(f"{bw:.0f} {tf:.0f}")
EOF
    then
        read -r BW TF <"$OUT/ceil.txt"
        log "ceilings measured: copy $BW GB/s, bf16 matmul $TF TFLOP/s"
    fi
    rm -f "$OUT/ceil.txt"
    step "bench_gpu" 300 "$OUT/bench.log" $RUNENV "$BIN/bench_gpu" --model "$MODEL" --reps "${BENCH_REPS:-20}" --bw "$BW" --tflops "$TF" --rows-out /tmp/bench_rows.jsonl --json /tmp/bench.json
    for item in ${BENCH_ENVS:-}; do
        echo "== ${item//,/ }" >>"$OUT/bench_ab.log"
        step "bench_gpu (${item//,/ })" 300 "$OUT/bench_ab.log" $RUNENV ${item//,/ } "$BIN/bench_gpu" --model "$MODEL" \
            --reps "${BENCH_REPS:-20}" --bw "$BW" --tflops "$TF"
    done
fi
if has batch; then
    step "bench_gpu --batch" 480 "$OUT/batch.log" $RUNENV "$BIN/bench_gpu" --model "$MODEL" --batch --reps "${BATCH_REPS:-30}"
    if [ "${BATCH_ABLATE:-0}" = 1 ]; then
        step "bench_gpu --batch --ablate" 480 "$OUT/batch_ablate.log" $RUNENV "$BIN/bench_gpu" --model "$MODEL" --batch \
            --ablate --reps "${BENCH_REPS:-20}"
    fi
fi
if has ablate; then
    step "bench_gpu --ablate" 300 "$OUT/ablate.log" $RUNENV "$BIN/bench_gpu" --model "$MODEL" --ablate --reps "${BENCH_REPS:-20}"
    for item in ${ABLATE_ENVS:-}; do
        echo "== ${item//,/ }" >>"$OUT/ablate.log"
        step "bench_gpu --ablate (${item//,/ })" 300 "$OUT/ablate.log" $RUNENV ${item//,/ } "$BIN/bench_gpu" --model "$MODEL" \
            --ablate --reps "${BENCH_REPS:-20}"
    done
fi
if has long; then
    step "test_long --backend cuda" 480 "$OUT/test_long.log" $RUNENV "$BIN/test_long" --backend cuda
fi
if has longbench; then
    step "bench_gpu --long" 400 "$OUT/long.log" $RUNENV "$BIN/bench_gpu" --model "$MODEL" --long --reps "${LONG_REPS:-3}" \
        --bw "$BW" --tflops "$TF"
fi
if has gemm; then
    step "gemm shapes (SQUAD_GEMM_BENCH=1)" 300 "$OUT/gemm.log" $RUNENV SQUAD_GEMM_BENCH=1 "$BIN/gpu_test_kernels"
fi
if has gemmtest; then
    step "gpu_test_gemm" 480 "$OUT/gemmtest.log" $RUNENV "$BIN/gpu_test_gemm"
fi
if has gemmprobe; then
    step "gpu_test_gemm probe (SQUAD_GEMM_PROBE=1)" 480 "$OUT/gemmprobe.log" $RUNENV SQUAD_GEMM_PROBE=1 "$BIN/gpu_test_gemm"
fi
if has hf && [ -e /tmp/bench_rows.jsonl ]; then
    step "hf_timing" 420 "$OUT/hf.log" env PYTHONUNBUFFERED=1 python3 tools/hf_timing.py --model "$MODEL" --rows /tmp/bench_rows.jsonl --reps "${HF_REPS:-5}" --out /tmp/hf.json --bench-json /tmp/bench.json
fi
if has hf_fla && [ -e /tmp/bench_rows.jsonl ] && [ -d "$ROOT/.fla/fla" ]; then
    step "hf_timing (flash-linear-attention, CUDA graphs)" 420 "$OUT/hf_fla.log" env PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT/.fla" \
        python3 tools/hf_timing.py --model "$MODEL" --rows /tmp/bench_rows.jsonl --reps "${HF_REPS:-5}" --graph --no-fp32 \
        --bench-json /tmp/bench.json
fi
if has layers && [ -e "$CARRY/q08_row.jsonl" ]; then
    step "hf_layers" 180 "$OUT/hf.log" env PYTHONUNBUFFERED=1 python3 tools/hf_layers.py --model "$MODEL" --row "$CARRY/q08_row.jsonl" --out "$OUT/hf_layers.json"
fi
if has serve; then
    # a decision request with three questions about a cached ~4096-token state, client latency
    # against the engine's own time for its rows (tools/server_gpu_check.sh)
    step "server_gpu_check" 400 "$OUT/serve.log" env LD_LIBRARY_PATH=$CARRY/lib:$CUBLAS_DIR bash tools/server_gpu_check.sh \
        "$BIN/squad" "$CARRY/tokenizer.json" /tmp/serve_check
fi
if has serveload; then
    # the agent-trace load and memo-answered requests through the server on the GPU
    mkdir -p third_party/qwen3 && cp --update=none "$CARRY/tokenizer.json" third_party/qwen3/tokenizer.json
    step "bench_server.sh (cuda)" 560 "$OUT/serveload.log" env LD_LIBRARY_PATH=$CARRY/lib:$CUBLAS_DIR \
        PRESET=qwen3.5-0.8b SERVE_ARGS="--device cuda" STEPS=${TRACE_STEPS:-6} MEMO_REQUESTS=${MEMO_REQUESTS:-100000} \
        bash tools/bench_server.sh "$BIN"
fi
if has tierbench; then
    # the tier figures through the server (issue 29): host tier on / off, restart with / without --cache-dir
    mkdir -p third_party/qwen3 && cp --update=none "$CARRY/tokenizer.json" third_party/qwen3/tokenizer.json
    step "tier_bench.sh (cuda)" 300 "$OUT/tierbench.log" env LD_LIBRARY_PATH=$CARRY/lib:$CUBLAS_DIR \
        PRESET=qwen3.5-0.8b SERVE_ARGS="--device cuda" STEPS=${TRACE_STEPS:-6} bash tools/tier_bench.sh "$BIN"
fi
if has hftrace; then
    # the earlier runtime's setup on the agent trace's rows (tools/hf_trace.py), on the model and trace
    # the serveload step made (run it first, in the same call)
    tm=$(ls -d "$BIN"/bench-data/qwen3.5-0.8b-qwen-tokenizer 2>/dev/null | head -1)
    tt=$(ls -t "$BIN"/bench-data/server-trace-s"${SEED:-1}"-*.jsonl 2>/dev/null | head -1)
    if [ -n "$tm" ] && [ -n "$tt" ]; then
        step "hf_trace" 420 "$OUT/hf_trace.log" env PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT/.fla" \
            python3 tools/hf_trace.py --model "$tm" --trace "$tt" --concurrency "${BATCH_LEVEL:-32}" ${HF_TRACE_ARGS:-}
    else
        log "hftrace: no bench-data model / trace under $BIN (run the serveload step first)"
    fi
fi
if has spec; then
    # shellcheck disable=SC2086
    step "spec_bench.sh" 300 "$OUT/summary.log" bash tools/spec_bench.sh "$CARRY" "$OUT/spec" ${SPEC_ENVS:-}
fi
if has specfix; then
    # the specialists' reference fixtures (transformers + peft live on this machine, not on the
    # development machine); copy the archive's contents into tests/fixtures/specialists/
    rm -rf /tmp/specfix
    step "make_specialist_fixtures" 480 "$OUT/specfix.log" env PYTHONUNBUFFERED=1 python3 tools/make_specialist_fixtures.py --out /tmp/specfix &&
        tar czf "$OUT/specfix.tgz" -C /tmp/specfix .
fi
if has memcheck; then
    step "memcheck gpu_test_kernels" 300 "$OUT/memcheck.log" $RUNENV SQUAD_GPU_TEST_QUICK=1 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 9 "$BIN/gpu_test_kernels"
    step "memcheck gpu_test_backend (quick)" 300 "$OUT/memcheck.log" $RUNENV SQUAD_GPU_TEST_QUICK=1 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/gpu_test_backend"
    step "memcheck gpu_test_batch (quick)" 480 "$OUT/memcheck.log" $RUNENV SQUAD_GPU_TEST_QUICK=1 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 9 "$BIN/gpu_test_batch"
    step "memcheck gpu_test_specialists (quick, LoRA kernels)" 300 "$OUT/memcheck.log" $RUNENV SQUAD_GPU_TEST_QUICK=1 SQUAD_GPU_TEST_LORA_ONLY=1 \
        compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/gpu_test_specialists"
fi
if has racecheck; then
    step "racecheck gpu_test_kernels" 300 "$OUT/racecheck.log" $RUNENV SQUAD_GPU_TEST_QUICK=1 compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 9 "$BIN/gpu_test_kernels"
    # the batched kernels alone: the whole batch test does not finish under racecheck in the step's time
    step "racecheck gpu_test_batch (quick, kernels)" 300 "$OUT/racecheck.log" $RUNENV SQUAD_GPU_TEST_QUICK=1 SQUAD_GPU_TEST_MIXERS_ONLY=1 \
        compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 9 "$BIN/gpu_test_batch"
    # the specialists' kernels (the widened inputs, the fold: clusters and distributed shared memory)
    step "racecheck gpu_test_specialists (quick, LoRA kernels)" 300 "$OUT/racecheck.log" $RUNENV SQUAD_GPU_TEST_QUICK=1 SQUAD_GPU_TEST_LORA_ONLY=1 \
        compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 9 "$BIN/gpu_test_specialists"
fi
log "done"
# The run tool brings back at most 8 files from $OUT: PACK_LOGS=1 leaves one archive, OUTDIR.tgz,
# in place of the folder (the summary is printed first, so the call's output still shows it). A
# second invocation on the same OUTDIR (the arms of an A/B) gets OUTDIR.2.tgz, .3 ..., never
# overwriting an earlier archive.
if [ "${PACK_LOGS:-0}" = 1 ]; then
    cat "$SUM"
    pack=$OUT.tgz
    n=2
    while [ -e "$pack" ]; do pack=$OUT.$n.tgz; n=$((n + 1)); done
    tar czf "$pack" -C "$OUT" . && rm -rf "$OUT"
fi
exit 0
