/*
 * gemm_plans.cu — the GEMM algorithms the tuning chose, kept in a small text file across processes.
 *
 * Why: k_gemm.cu picks each shape's cuBLASLt algorithm by timing the candidates, and timings are
 * noisy, so two processes on the same GPU could pick different algorithms for a shape and give
 * different bits for the same row. The first process to tune a shape writes its choice here; every
 * later process on the same GPU model, cuBLASLt and CUDA runtime reads it, runs the same algorithm
 * (the same bits) and skips the tuning (a faster start).
 *
 * The file: cuda_knobs.gemm_plans, resolved once at the backend's creation (SQUAD_GEMM_PLANS names
 * it, "off" or empty: no file; else $XDG_CACHE_HOME/squad/gemm-plans.txt, else
 * ~/.cache/squad/gemm-plans.txt: cuda_knobs_read). Its first line is a
 * header (format, GPU name, compute capability, multiprocessors, cuBLASLt, CUDA runtime and
 * workspace size); each further line one shape: "M N K acc f32" and the algorithm's eight opaque
 * 64-bit words in hex (cublasLtMatmulAlgo_t is plain data, meaningful to the same cuBLASLt on the
 * same GPU, which the header pins), or, where the tuning chose the sm_90a kernel (k_gemm_sm90.cu),
 * "M N K acc f32 sm90a WG NT SPLITS" (its configuration). Files written before that second form
 * existed read as they did. A file with another header, a malformed line or too many lines
 * is ignored as a whole and replaced by the next write. k_gemm.cu still checks every stored
 * algorithm with cublasLtMatmulAlgoCheck before using it. Writes go to a temporary file renamed
 * over the old one, so a concurrent reader sees the old file or the new one, never half of one;
 * two writers race benignly (the last rename wins; a lost shape is tuned again later).
 * Nothing here is fatal: any failure leaves the store empty or in memory only.
 */
#include "cuda_internal.cuh"

#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define PLANS_FORMAT "squad-gemm-plans 1"
#define PLANS_MAX_RECS 4096 /* a real model has a few dozen shapes; more means a damaged file */
#define PLANS_LINE_BYTES 512
#define PLANS_SM90_TAG "sm90a" /* a line of the sm_90a kernel's configuration */
#define ALGO_WORDS ((int)(sizeof(cublasLtMatmulAlgo_t) / sizeof(uint64_t)))
static_assert(sizeof(cublasLtMatmulAlgo_t) % sizeof(uint64_t) == 0, "the algorithm is stored as 64-bit words");

/* The header of device dev: every field that decides whether a stored algorithm means the same. */
static void make_header(cu_plan_store *s, int dev, size_t ws_bytes) {
    cudaDeviceProp prop;
    int rt = 0;
    if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess || cudaRuntimeGetVersion(&rt) != cudaSuccess) {
        s->enabled = 0; /* without the GPU's identity a stored plan cannot be trusted */
        return;
    }
    char name[sizeof prop.name];
    snprintf(name, sizeof name, "%s", prop.name);
    for (char *c = name; *c; c++)
        if (*c == ' ' || *c == '\t' || *c == '\n') *c = '_';
    snprintf(s->header, sizeof s->header, "%s gpu=%s cc=%d.%d sms=%d cublaslt=%zu cudart=%d ws=%zu", PLANS_FORMAT,
             name, prop.major, prop.minor, prop.multiProcessorCount, (size_t)cublasLtGetVersion(), rt, ws_bytes);
}

void cu_plan_store_init(cu_plan_store *s, const char *path, int dev, size_t ws_bytes) {
    memset(s, 0, sizeof *s);
    const int n = path && path[0] ? snprintf(s->path, sizeof s->path, "%s", path) : -1;
    s->enabled = n > 0 && n < (int)sizeof s->path;
    if (s->enabled) make_header(s, dev, ws_bytes);
}

void cu_plan_store_free(cu_plan_store *s) {
    free(s->recs);
    memset(s, 0, sizeof *s);
}

static int push(cu_plan_store *s, const cu_plan_rec *r) {
    if (s->n == s->cap) {
        const int cap = s->cap ? 2 * s->cap : 64;
        cu_plan_rec *nr = (cu_plan_rec *)realloc(s->recs, sizeof *nr * (size_t)cap);
        if (!nr) return -1;
        s->recs = nr;
        s->cap = cap;
    }
    s->recs[s->n++] = *r;
    return 0;
}

/* One shape line; 0 when it parses completely. */
static int parse_line(const char *line, cu_plan_rec *r) {
    int used = 0;
    memset(r, 0, sizeof *r);
    if (sscanf(line, "%d %d %d %d %d%n", &r->M, &r->N, &r->K, &r->acc, &r->f32, &used) != 5) return -1;
    if (r->M < 1 || r->N < 1 || r->K < 1 || ((r->acc | r->f32) & ~1) != 0) return -1;
    const char *p = line + used;
    while (*p == ' ') p++;
    if (!strncmp(p, PLANS_SM90_TAG " ", sizeof PLANS_SM90_TAG)) {
        int n2 = 0;
        r->kind = CU_GEMM_SM90;
        if (sscanf(p + sizeof PLANS_SM90_TAG, "%d %d %d%n", &r->cfg.wg, &r->cfg.nt, &r->cfg.splits, &n2) != 3)
            return -1;
        if (r->cfg.wg < 1 || r->cfg.nt < 1 || r->cfg.splits < 1) return -1; /* the kernel checks the rest */
        p += sizeof PLANS_SM90_TAG + n2;
        while (*p == ' ' || *p == '\n' || *p == '\r') p++;
        return *p ? -1 : 0;
    }
    r->kind = CU_GEMM_LT;
    uint64_t w[ALGO_WORDS];
    for (int i = 0; i < ALGO_WORDS; i++) {
        char *end = NULL;
        errno = 0;
        const unsigned long long v = strtoull(p, &end, 16);
        if (errno || end == p) return -1;
        w[i] = (uint64_t)v;
        p = end;
    }
    while (*p == ' ' || *p == '\n' || *p == '\r') p++;
    if (*p) return -1;
    memcpy(&r->algo, w, sizeof w);
    return 0;
}

/* Reads the file once. Anything unexpected empties the store: the next write replaces the file. */
static void load(cu_plan_store *s) {
    s->loaded = 1;
    FILE *f = fopen(s->path, "r");
    if (!f) return;
    char line[PLANS_LINE_BYTES];
    int ok = fgets(line, sizeof line, f) != NULL;
    if (ok) {
        line[strcspn(line, "\n")] = 0;
        ok = !strcmp(line, s->header);
    }
    while (ok && fgets(line, sizeof line, f)) {
        cu_plan_rec r;
        ok = strchr(line, '\n') != NULL && parse_line(line, &r) == 0 && s->n < PLANS_MAX_RECS && push(s, &r) == 0;
    }
    if (ok && ferror(f)) ok = 0;
    fclose(f);
    if (!ok) s->n = 0;
}

const cu_plan_rec *cu_plan_store_find(cu_plan_store *s, int M, int N, int K, int acc, int f32) {
    if (!s->enabled) return NULL;
    if (!s->loaded) load(s);
    for (int i = 0; i < s->n; i++) {
        const cu_plan_rec *r = &s->recs[i];
        if (r->M == M && r->N == N && r->K == K && r->acc == acc && r->f32 == f32) return r;
    }
    return NULL;
}

/* mkdir -p of the directory holding path (a missing ~/.cache is usual on a fresh machine). */
static void make_parent_dirs(const char *path) {
    char dir[sizeof ((cu_plan_store *)0)->path];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return;
    *slash = 0;
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        mkdir(dir, 0755);
        *p = '/';
    }
    mkdir(dir, 0755);
}

static void write_file(const cu_plan_store *s) {
    /* a unique temporary name (mkstemp): two writers, even two backends of one process, never
     * share one */
    char tmp[sizeof s->path + 16];
    if (snprintf(tmp, sizeof tmp, "%s.XXXXXX", s->path) >= (int)sizeof tmp) return;
    make_parent_dirs(s->path);
    const int fd = mkstemp(tmp);
    if (fd < 0) return;
    (void)fchmod(fd, 0644); /* mkstemp's 0600 would hide the file from other users of a shared path */
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        unlink(tmp);
        return;
    }
    int ok = fprintf(f, "%s\n", s->header) > 0;
    for (int i = 0; ok && i < s->n; i++) {
        const cu_plan_rec *r = &s->recs[i];
        uint64_t w[ALGO_WORDS];
        memcpy(w, &r->algo, sizeof w);
        ok = fprintf(f, "%d %d %d %d %d", r->M, r->N, r->K, r->acc, r->f32) > 0;
        if (r->kind == CU_GEMM_SM90)
            ok = ok && fprintf(f, " " PLANS_SM90_TAG " %d %d %d", r->cfg.wg, r->cfg.nt, r->cfg.splits) > 0;
        else
            for (int j = 0; ok && j < ALGO_WORDS; j++) ok = fprintf(f, " %016llx", (unsigned long long)w[j]) > 0;
        ok = ok && fputc('\n', f) != EOF;
    }
    ok = fflush(f) == 0 && ok;
    ok = fsync(fileno(f)) == 0 && ok;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, s->path) != 0) unlink(tmp);
}

void cu_plan_store_add(cu_plan_store *s, const cu_plan_rec *r) {
    if (!s->enabled) return;
    if (!s->loaded) load(s);
    for (int i = 0; i < s->n; i++) {
        cu_plan_rec *q = &s->recs[i];
        if (q->M == r->M && q->N == r->N && q->K == r->K && q->acc == r->acc && q->f32 == r->f32) {
            *q = *r;
            write_file(s);
            return;
        }
    }
    if (s->n >= PLANS_MAX_RECS || push(s, r)) return;
    write_file(s);
}
