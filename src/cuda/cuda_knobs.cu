/*
 * cuda_knobs.cu — the CUDA backend's switches (cuda_knobs, cuda_internal.cuh): the only place the
 * backend reads the environment.
 *
 * Design: a backend reads its switches once, when it is made (backend_cuda.cu's build), checks
 * every value and refuses a bad one with a message naming the variable, so a typo never silently
 * runs the default; the values then travel in the backend and in the kernels' arguments, and no
 * launch path calls getenv. Each switch that stays is operational (debugging, memory, a portable
 * kernel on a Hopper GPU, where tuned plans live); the A/B switches of finished experiments were
 * removed with their losing arms (docs/cuda.md, "Switches" and "Removed experiments").
 */
#include "cuda_internal.cuh"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>

#define KNOB_GRAPHS "SQUAD_CUDA_GRAPHS"
#define KNOB_MAX_CHUNK "SQUAD_MAX_CHUNK"
#define KNOB_ATT_SM90 "SQUAD_ATT_SM90"
#define KNOB_GEMM_SM90 "SQUAD_GEMM_SM90"
#define KNOB_GEMM_PLANS "SQUAD_GEMM_PLANS"
#define KNOB_GDN_FUSED_ROWS "SQUAD_GDN_FUSED_ROWS"
#define KNOB_MAX_CHUNK_LIMIT (1 << 20)
#define PLANS_FILE "squad/gemm-plans.txt" /* under $XDG_CACHE_HOME, else ~/.cache */

/* An integer variable in [lo, hi]: unset or empty keeps *out; anything else that is not a whole
 * decimal number in range is refused. */
static int knob_int(const char *name, int lo, int hi, int *out, squad_err *err) {
    const char *v = getenv(name);
    if (!v || !v[0]) return 0;
    char *end = NULL;
    errno = 0;
    const long n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < lo || n > hi)
        return cu_err(err, SQUAD_E_INVALID, "%s=%s: expected a whole number from %d to %d", name, v, lo, hi);
    *out = (int)n;
    return 0;
}

/* The plan file: the variable when set ("off" or empty: none), else the per-user cache. */
static int knob_plans(char *path, size_t cap, squad_err *err) {
    const char *v = getenv(KNOB_GEMM_PLANS);
    path[0] = 0;
    if (v) {
        if (!v[0] || !strcmp(v, "off")) return 0;
        if (strlen(v) >= cap)
            return cu_err(err, SQUAD_E_INVALID, "%s: a path of %zu bytes (at most %zu)", KNOB_GEMM_PLANS, strlen(v),
                          cap - 1);
        snprintf(path, cap, "%s", v);
        return 0;
    }
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n = -1;
    if (xdg && xdg[0] == '/') n = snprintf(path, cap, "%s/" PLANS_FILE, xdg);
    else if (home && home[0] == '/') n = snprintf(path, cap, "%s/.cache/" PLANS_FILE, home);
    if (n < 0 || n >= (int)cap) path[0] = 0; /* no usable default: tuned plans stay in memory */
    return 0;
}

int cuda_knobs_read(cuda_knobs *k, squad_err *err) {
    memset(k, 0, sizeof *k);
    k->graphs = 1;
    k->max_chunk = CU_DEFAULT_MAX_CHUNK;
    k->att_sm90 = 1;
    k->gemm_sm90 = 1;
    k->gdn_fused_rows = CU_GDN_FUSED_ROWS;
    int rc;
    if ((rc = knob_int(KNOB_GRAPHS, 0, 1, &k->graphs, err))) return rc;
    if ((rc = knob_int(KNOB_MAX_CHUNK, 1, KNOB_MAX_CHUNK_LIMIT, &k->max_chunk, err))) return rc;
    if ((rc = knob_int(KNOB_ATT_SM90, 0, 1, &k->att_sm90, err))) return rc;
    if ((rc = knob_int(KNOB_GEMM_SM90, 0, 1, &k->gemm_sm90, err))) return rc;
    if ((rc = knob_int(KNOB_GDN_FUSED_ROWS, 0, KNOB_MAX_CHUNK_LIMIT, &k->gdn_fused_rows, err))) return rc;
    return knob_plans(k->gemm_plans, sizeof k->gemm_plans, err);
}
