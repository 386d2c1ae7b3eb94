/*
 * fuzz_cache_store.c — libFuzzer target for the disk tier's reader (src/cache_store.c): any bytes as
 * a cache file, read against a small fixed shape whose identity matches the seeds' (so the fuzzer
 * gets past the header and into the records). Whatever the bytes, the reader must not crash, leak
 * or read out of bounds, and every record it keeps must satisfy the shape's bounds (checked by
 * adopting nothing: the snapshot is counted and freed).
 *
 * Seeds (tests/fuzz/corpus/fuzz_cache_store/) are written by the target itself when run with
 * SQUAD_FUZZ_WRITE_SEEDS=DIR: a valid file of one group and two checkpoints, and cut copies.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache_store.h"

static const squad_store_shape SHAPE = {
    .identity = {0x1111111111111111ull, 0x2222222222222222ull},
    .gdn_bytes = 64,
    .kv_bytes_per_pos = 8,
    .align = 4,
    .feat_dim = 1,
    .max_positions = 64,
    .vocab = 100,
    .n_routes = 2,
};

/* ---- the seeds: a cache over a stand-in backend whose blobs are host memory ------------------ */

static void *seed_alloc(squad_backend *be, size_t bytes, squad_err *err) {
    (void)be;
    (void)err;
    return calloc(1, bytes);
}
static void seed_release(squad_backend *be, void *p) {
    (void)be;
    free(p);
}

static void write_cut(const char *dir, const char *name, const char *from, long keep) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *a = fopen(from, "rb"), *b = fopen(path, "wb");
    long i = 0;
    int ch;
    while (a && b && (ch = fgetc(a)) != EOF && (keep < 0 || i++ < keep)) fputc(ch, b);
    if (a) fclose(a);
    if (b) fclose(b);
}

static void write_seeds(const char *dir) {
    squad_backend be;
    memset(&be, 0, sizeof be);
    be.name = "seed";
    be.gdn_snapshot_bytes = SHAPE.gdn_bytes;
    be.kv_bytes_per_pos = SHAPE.kv_bytes_per_pos;
    be.max_context = SHAPE.max_positions;
    be.max_chunk = SHAPE.max_positions;
    be.alloc = seed_alloc;
    be.release = seed_release;
    squad_cache_opts o = {1 << 20, SHAPE.align, 0, 0, 4, 4, 0};
    squad_err err = {0};
    squad_cache *c = squad_cache_new(&be, &o, &err);
    if (!c || squad_cache_set_feat_dim(c, SHAPE.feat_dim, &err)) exit(1);
    int32_t ids[16];
    uint8_t kv[16 * 8], gdn[64];
    double feat[1] = {0.5};
    for (int i = 0; i < 16; i++) ids[i] = i * 3 % SHAPE.vocab;
    for (size_t i = 0; i < sizeof kv; i++) kv[i] = (uint8_t)i;
    for (size_t i = 0; i < sizeof gdn; i++) gdn[i] = (uint8_t)(255 - i);
    cache_group *g = NULL;
    for (int pos = 8; pos <= 16; pos += 8) {
        squad_cache_entry e = {NULL, ids, 16, 1, kv, 1, pos, gdn, 1, feat, pos / 2, 1};
        if (squad_cache_adopt(c, &g, &e) != 1) exit(1);
    }
    char sub[1024];
    snprintf(sub, sizeof sub, "%s/store", dir);
    squad_cache_store_stats st;
    if (squad_store_save(c, &SHAPE, sub, &st, &err)) exit(1);
    char file[1100];
    snprintf(file, sizeof file, "%s/" SQUAD_STORE_FILE, sub);
    write_cut(dir, "valid", file, -1);
    write_cut(dir, "cut_header", file, 40);
    write_cut(dir, "cut_record", file, (long)st.bytes - 30);
    remove(file);
    remove(sub);
    squad_cache_free(c);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *dir = getenv("SQUAD_FUZZ_WRITE_SEEDS");
    if (dir) {
        write_seeds(dir);
        exit(0);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fmemopen((void *)data, size ? size : 1, "rb");
    if (!f) return 0;
    squad_cache_store_stats st;
    memset(&st, 0, sizeof st);
    squad_err err = {0};
    squad_cache_snapshot *s = squad_store_read_stream(f, size, &SHAPE, NULL, &st, &err);
    fclose(f);
    if (s && (uint64_t)squad_store_snapshot_count(s) != st.checkpoints) abort();
    squad_cache_snapshot_free(s);
    return 0;
}
