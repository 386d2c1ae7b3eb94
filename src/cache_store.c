/*
 * cache_store.c — the disk tier's file: the state cache's checkpoints written at a clean shutdown
 * and read back at the next start (interface in cache_store.h; docs/design.md section 7, "Tiers").
 *
 * The format (little-endian, as the machines squad runs on; version SQUAD_STORE_VERSION):
 *
 *   header   "SQUADSTC" | u32 version | u32 header bytes (64) | u64 identity[2] | u64 gdn bytes |
 *            u64 K / V bytes per position | u32 align | u32 router features | u64 checksum of the
 *            56 bytes before it
 *   records  u32 "SQRC" | u32 kind | u64 payload bytes | u64 checksum of the payload |
 *            u64 checksum of the 24 bytes before it, then the payload:
 *     group (kind 1)       u32 number | i32 route | i32 positions n | u32 0 | i32 ids[n] |
 *                          K / V blob (n x K / V bytes per position)
 *     checkpoint (kind 2)  u32 group number | i32 position | i32 route | u32 features f |
 *                          i64 feature count | f64 features[f] | GDN blob
 *
 * The records come most recently used first, each group before its first checkpoint, so a reader
 * whose budget is smaller than the file keeps the most recent states. The identity is two 64-bit
 * hashes over config.json, each safetensors file's header and the first bytes of each tensor
 * (two checkpoints of one architecture differ there), the tokenizer file, the specialists (their
 * labels, router and adapters' first values) and the backend's blob layout (its name, precision
 * and blob sizes): blobs are the backend's own bytes, meaningful only to the same model, backend
 * and precision.
 *
 * Reading trusts nothing: a header of another identity or shape refuses the file; a record whose
 * header checksum fails ends the read (its length cannot be trusted, so nothing after it can be
 * found), one whose payload checksum fails or whose contents are inconsistent (sizes, positions,
 * routes, token ids, an unknown or repeated group) is refused alone and the next one read. Every
 * refusal is one log line. A file shorter than its records say (a crash mid-write, a copy cut
 * short) loads the records before the cut.
 */
#include "cache_store.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hash_index.h"
#include "util.h"

#define SQUAD_STORE_MAGIC "SQUADSTC"
#define SQUAD_STORE_VERSION 1u
#define SQUAD_STORE_HEADER_BYTES 64u
#define SQUAD_STORE_RECORD_MAGIC 0x43525153u /* "SQRC" */
#define SQUAD_STORE_RECORD_BYTES 32u
#define SQUAD_STORE_GROUP 1u
#define SQUAD_STORE_CKPT 2u
#define SQUAD_STORE_GROUP_FIXED 16u /* a group payload before its ids */
#define SQUAD_STORE_CKPT_FIXED 24u  /* a checkpoint payload before its features */
/* Seeds of the checksums and of the two identity hashes. */
#define SQUAD_STORE_SUM_SEED 0x5351554144535443ull
#define SQUAD_STORE_ID_SEED_A 0x6a09e667f3bcc908ull
#define SQUAD_STORE_ID_SEED_B 0xbb67ae8584caa73bull
/* The bytes of each tensor that join the identity. */
#define SQUAD_STORE_TENSOR_SAMPLE 256u
/* Adapter values (of A and of B, per projection) that join the identity. */
#define SQUAD_STORE_ADAPTER_SAMPLE 64

/* ---- identity -------------------------------------------------------------------------------- */

typedef struct id_hash {
    uint64_t a, b;
} id_hash;

static void id_add(id_hash *h, const void *p, size_t n) {
    h->a = squad_hash_bytes(h->a, p, n);
    h->b = squad_hash_bytes(h->b ^ h->a, p, n);
}

static void id_add_str(id_hash *h, const char *s) { id_add(h, s, strlen(s) + 1); }

static int id_add_file(id_hash *h, const char *path, squad_err *err) {
    size_t len = 0;
    char *text = squad_read_file(path, &len, err);
    if (!text) return err->code ? err->code : SQUAD_E_IO;
    id_add(h, &len, sizeof len);
    id_add(h, text, len);
    free(text);
    return 0;
}

/* Each weights file: its header (names, dtypes, shapes, offsets) and each tensor's first bytes. */
static void id_add_weights(id_hash *h, const st_set *set) {
    for (int f = 0; f < set->n_files; f++) {
        const st_file *file = &set->files[f];
        uint64_t header_len = 0;
        if (file->map && file->map_size >= 8) {
            memcpy(&header_len, file->map, 8);
            if (header_len <= file->map_size - 8) id_add(h, file->map, (size_t)(8 + header_len));
        }
        for (int t = 0; t < file->n_tensors; t++) {
            const st_tensor *x = &file->tensors[t];
            id_add_str(h, x->name);
            id_add(h, x->data, x->nbytes < SQUAD_STORE_TENSOR_SAMPLE ? x->nbytes : SQUAD_STORE_TENSOR_SAMPLE);
        }
    }
}

static void id_add_floats(id_hash *h, const float *v, size_t n, size_t cap) {
    if (v) id_add(h, v, (n < cap ? n : cap) * sizeof *v);
}

static void id_add_specialists(id_hash *h, const squad_specialists *sp) {
    const int R = sp->router.n_labels;
    id_add(h, &sp->split, sizeof sp->split);
    id_add(h, &sp->router.layer, sizeof sp->router.layer);
    id_add(h, &R, sizeof R);
    for (int r = 0; r < R; r++) id_add_str(h, sp->labels[r]);
    id_add_floats(h, sp->router.weight, (size_t)R * (size_t)sp->router.hidden, (size_t)-1);
    id_add_floats(h, sp->router.bias, (size_t)R, (size_t)-1);
    for (int r = 1; r < R; r++) {
        const squad_adapter *a = &sp->adapters[r];
        id_add(h, &a->r, sizeof a->r);
        id_add(h, &a->scale, sizeof a->scale);
        for (int l = 0; a->proj && l < a->n_layers; l++)
            for (int p = 0; p < SQUAD_PROJ_COUNT; p++) {
                const squad_lora_proj *q = &a->proj[l][p];
                if (!q->A) continue;
                id_add_floats(h, q->A, (size_t)q->r * (size_t)q->in, SQUAD_STORE_ADAPTER_SAMPLE);
                id_add_floats(h, q->B, (size_t)q->out * (size_t)q->r, SQUAD_STORE_ADAPTER_SAMPLE);
            }
    }
}

int squad_store_identity(const squad_model *model, const squad_specialists *sp, const char *tokenizer_path,
                         const char *backend, int precision, uint64_t out[2], squad_err *err) {
    id_hash h = {SQUAD_STORE_ID_SEED_A, SQUAD_STORE_ID_SEED_B};
    char *config = squad_path_join(model->dir, "config.json", err);
    if (!config) return err->code;
    int rc = id_add_file(&h, config, err);
    free(config);
    if (rc) return squad_fail_context(err, "cache identity: ");
    id_add_weights(&h, &model->files);
    id_add_str(&h, "tokenizer");
    if (tokenizer_path && (rc = id_add_file(&h, tokenizer_path, err)) != 0)
        return squad_fail_context(err, "cache identity: ");
    id_add_str(&h, "specialists");
    if (sp) id_add_specialists(&h, sp);
    id_add_str(&h, backend);
    id_add(&h, &precision, sizeof precision);
    out[0] = h.a;
    out[1] = h.b;
    return 0;
}

/* ---- little-endian fields -------------------------------------------------------------------- */

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint64_t checksum(const void *p, size_t n) { return squad_hash_bytes(SQUAD_STORE_SUM_SEED, p, n); }

static void header_make(const squad_store_shape *s, uint8_t out[SQUAD_STORE_HEADER_BYTES]) {
    memset(out, 0, SQUAD_STORE_HEADER_BYTES);
    memcpy(out, SQUAD_STORE_MAGIC, 8);
    put32(out + 8, SQUAD_STORE_VERSION);
    put32(out + 12, SQUAD_STORE_HEADER_BYTES);
    put64(out + 16, s->identity[0]);
    put64(out + 24, s->identity[1]);
    put64(out + 32, s->gdn_bytes);
    put64(out + 40, s->kv_bytes_per_pos);
    put32(out + 48, (uint32_t)s->align);
    put32(out + 52, (uint32_t)s->feat_dim);
    put64(out + 56, checksum(out, 56));
}

/* ---- writing --------------------------------------------------------------------------------- */

typedef struct store_writer {
    const squad_cache *cache;
    const squad_store_shape *shape;
    FILE *f;
    const void **groups; /* the group keys written, in order: a group's number is its index */
    int n_groups, cap_groups;
    uint8_t *buf; /* a record's payload */
    size_t cap;
    squad_cache_store_stats *st;
    squad_err *err;
} store_writer;

static int writer_room(store_writer *w, size_t n) {
    if (n <= w->cap) return 0;
    uint8_t *b = realloc(w->buf, n);
    if (!b) return squad_fail(w->err, SQUAD_E_NOMEM, "cache save: out of memory for a %zu-byte record", n);
    w->buf = b;
    w->cap = n;
    return 0;
}

static int write_record(store_writer *w, uint32_t kind, size_t n) {
    uint8_t h[SQUAD_STORE_RECORD_BYTES];
    put32(h, SQUAD_STORE_RECORD_MAGIC);
    put32(h + 4, kind);
    put64(h + 8, (uint64_t)n);
    put64(h + 16, checksum(w->buf, n));
    put64(h + 24, checksum(h, 24));
    if (fwrite(h, 1, sizeof h, w->f) != sizeof h || fwrite(w->buf, 1, n, w->f) != n)
        return squad_fail(w->err, SQUAD_E_IO, "cache save: cannot write: %s", strerror(errno));
    w->st->bytes += sizeof h + n;
    return 0;
}

static int write_group(store_writer *w, const squad_cache_entry *e, uint32_t no) {
    const size_t kv_bytes = (size_t)e->n_pos * w->shape->kv_bytes_per_pos;
    const size_t n = SQUAD_STORE_GROUP_FIXED + (size_t)e->n_pos * sizeof(int32_t) + kv_bytes;
    if (writer_room(w, n)) return w->err->code;
    put32(w->buf, no);
    put32(w->buf + 4, (uint32_t)e->group_route);
    put32(w->buf + 8, (uint32_t)e->n_pos);
    put32(w->buf + 12, 0);
    memcpy(w->buf + SQUAD_STORE_GROUP_FIXED, e->ids, (size_t)e->n_pos * sizeof(int32_t));
    if (squad_cache_blob_read(w->cache, w->buf + n - kv_bytes, e->kv, e->kv_on_host, kv_bytes))
        return squad_fail(w->err, SQUAD_E_BACKEND, "cache save: cannot read a K / V blob back from the device");
    w->st->groups++;
    return write_record(w, SQUAD_STORE_GROUP, n);
}

static int write_ckpt(store_writer *w, const squad_cache_entry *e, uint32_t group_no) {
    const size_t feat_bytes = (size_t)w->shape->feat_dim * sizeof(double);
    const size_t n = SQUAD_STORE_CKPT_FIXED + feat_bytes + w->shape->gdn_bytes;
    if (writer_room(w, n)) return w->err->code;
    put32(w->buf, group_no);
    put32(w->buf + 4, (uint32_t)e->pos);
    put32(w->buf + 8, (uint32_t)e->route);
    put32(w->buf + 12, (uint32_t)w->shape->feat_dim);
    put64(w->buf + 16, (uint64_t)e->feat_count);
    if (feat_bytes && e->feat) memcpy(w->buf + SQUAD_STORE_CKPT_FIXED, e->feat, feat_bytes);
    else memset(w->buf + SQUAD_STORE_CKPT_FIXED, 0, feat_bytes);
    if (squad_cache_blob_read(w->cache, w->buf + n - w->shape->gdn_bytes, e->gdn, e->gdn_on_host, w->shape->gdn_bytes))
        return squad_fail(w->err, SQUAD_E_BACKEND, "cache save: cannot read a GDN blob back from the device");
    w->st->checkpoints++;
    return write_record(w, SQUAD_STORE_CKPT, n);
}

static int write_entry(void *ctx, const squad_cache_entry *e) {
    store_writer *w = ctx;
    int no = 0;
    while (no < w->n_groups && w->groups[no] != e->group_key) no++;
    if (no == w->n_groups) {
        if (w->n_groups == w->cap_groups) {
            const int cap = w->cap_groups ? 2 * w->cap_groups : 64;
            const void **g = realloc(w->groups, (size_t)cap * sizeof *g);
            if (!g) return squad_fail(w->err, SQUAD_E_NOMEM, "cache save: out of memory");
            w->groups = g;
            w->cap_groups = cap;
        }
        w->groups[w->n_groups++] = e->group_key;
        int rc = write_group(w, e, (uint32_t)no);
        if (rc) return rc;
    }
    return write_ckpt(w, e, (uint32_t)no);
}

int squad_store_save(const squad_cache *cache, const squad_store_shape *shape, const char *dir,
                     squad_cache_store_stats *st, squad_err *err) {
    const double t0 = squad_now_seconds();
    memset(st, 0, sizeof *st);
    if (squad_mkdir_p(dir, err)) return squad_fail_context(err, "cache save: ");
    char *path = squad_path_join(dir, SQUAD_STORE_FILE, err);
    char *tmp = path ? squad_path_join(dir, SQUAD_STORE_FILE ".tmp", err) : NULL;
    if (!tmp) {
        free(path);
        return err->code;
    }
    store_writer w = {cache, shape, fopen(tmp, "wb"), NULL, 0, 0, NULL, 0, st, err};
    int rc = 0;
    if (!w.f) rc = squad_fail(err, SQUAD_E_IO, "cache save: cannot create %s: %s", tmp, strerror(errno));
    uint8_t header[SQUAD_STORE_HEADER_BYTES];
    header_make(shape, header);
    if (!rc && fwrite(header, 1, sizeof header, w.f) != sizeof header)
        rc = squad_fail(err, SQUAD_E_IO, "cache save: cannot write %s: %s", tmp, strerror(errno));
    st->bytes = sizeof header;
    if (!rc) rc = squad_cache_export(cache, write_entry, &w);
    if (!rc && (fflush(w.f) != 0 || fsync(fileno(w.f)) != 0))
        rc = squad_fail(err, SQUAD_E_IO, "cache save: cannot write %s: %s", tmp, strerror(errno));
    if (w.f && fclose(w.f) != 0 && !rc) rc = squad_fail(err, SQUAD_E_IO, "cache save: cannot close %s", tmp);
    if (!rc && rename(tmp, path) != 0)
        rc = squad_fail(err, SQUAD_E_IO, "cache save: cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (rc) unlink(tmp);
    free(w.groups);
    free(w.buf);
    free(tmp);
    free(path);
    st->seconds = squad_now_seconds() - t0;
    return rc;
}

/* ---- reading --------------------------------------------------------------------------------- */

typedef struct store_group {
    uint32_t no;
    int route, n_pos;
    uint8_t *buf; /* the record's payload: the ids, then the K / V */
    cache_group *adopted;
} store_group;

typedef struct store_ckpt {
    int group; /* index in the snapshot's groups */
    int pos, route;
    int64_t feat_count;
    uint8_t *buf; /* the record's payload: the features, then the GDN blob */
} store_ckpt;

struct squad_cache_snapshot {
    squad_store_shape shape;
    store_group *groups;
    int n_groups, cap_groups;
    store_ckpt *ckpts;
    int n_ckpts, cap_ckpts;
};

static void store_log(const squad_cache_store_opts *o, const char *fmt, ...) SQUAD_PRINTF(2, 3);
static void store_log(const squad_cache_store_opts *o, const char *fmt, ...) {
    if (!o || !o->log) return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    o->log(o->log_ctx, line);
}

/* Why a header is not this reader's (NULL when it is). */
static const char *header_mismatch(const uint8_t *h, const squad_store_shape *s) {
    if (memcmp(h, SQUAD_STORE_MAGIC, 8) != 0) return "not a squad cache file";
    if (get64(h + 56) != checksum(h, 56)) return "its header is corrupt";
    if (get32(h + 8) != SQUAD_STORE_VERSION || get32(h + 12) != SQUAD_STORE_HEADER_BYTES)
        return "another version of the format";
    if (get64(h + 16) != s->identity[0] || get64(h + 24) != s->identity[1])
        return "another model, tokenizer, specialists set or backend (identity differs)";
    if (get64(h + 32) != s->gdn_bytes || get64(h + 40) != s->kv_bytes_per_pos || get32(h + 48) != (uint32_t)s->align ||
        get32(h + 52) != (uint32_t)s->feat_dim)
        return "other checkpoint shapes";
    return NULL;
}

static int snap_find_group(const squad_cache_snapshot *s, uint32_t no) {
    for (int i = s->n_groups - 1; i >= 0; i--)
        if (s->groups[i].no == no) return i;
    return -1;
}

/* A group record's payload: why it is refused, or NULL once it is kept (it then owns buf). */
static const char *take_group(squad_cache_snapshot *s, uint8_t *buf, uint64_t n) {
    const squad_store_shape *sh = &s->shape;
    if (n < SQUAD_STORE_GROUP_FIXED) return "a group record too short";
    const uint32_t no = get32(buf);
    const int route = (int)get32(buf + 4), n_pos = (int)get32(buf + 8);
    if (n_pos <= 0 || n_pos % sh->align || n_pos > sh->max_positions) return "a group of an impossible length";
    if (n != SQUAD_STORE_GROUP_FIXED + (uint64_t)n_pos * (sizeof(int32_t) + sh->kv_bytes_per_pos))
        return "a group record of the wrong size";
    if (route < 0 || route >= sh->n_routes) return "a group of an unknown route";
    if (snap_find_group(s, no) >= 0) return "a group number given twice";
    for (int i = 0; i < n_pos; i++) {
        const int32_t id = (int32_t)get32(buf + SQUAD_STORE_GROUP_FIXED + 4 * (size_t)i);
        /* a negative id is an image's key token (image_rows.h): the state of a row with images */
        if (id >= sh->vocab) return "a token id outside the vocabulary";
    }
    if (s->n_groups == s->cap_groups) {
        const int cap = s->cap_groups ? 2 * s->cap_groups : 16;
        store_group *g = realloc(s->groups, (size_t)cap * sizeof *g);
        if (!g) return "out of memory";
        s->groups = g;
        s->cap_groups = cap;
    }
    s->groups[s->n_groups++] = (store_group){no, route, n_pos, buf, NULL};
    return NULL;
}

static const char *take_ckpt(squad_cache_snapshot *s, uint8_t *buf, uint64_t n) {
    const squad_store_shape *sh = &s->shape;
    if (n != SQUAD_STORE_CKPT_FIXED + (uint64_t)sh->feat_dim * sizeof(double) + sh->gdn_bytes)
        return "a checkpoint record of the wrong size";
    const int g = snap_find_group(s, get32(buf));
    if (g < 0) return "a checkpoint of a group the file does not hold (or refused)";
    const int pos = (int)get32(buf + 4), route = (int)get32(buf + 8);
    const int64_t feat_count = (int64_t)get64(buf + 16);
    if (get32(buf + 12) != (uint32_t)sh->feat_dim) return "a checkpoint with other router features";
    if (pos <= 0 || pos % sh->align || pos > s->groups[g].n_pos) return "a checkpoint outside its group";
    if (route != s->groups[g].route) return "a checkpoint of another route than its group";
    if (feat_count < 0 || feat_count > pos) return "a checkpoint with an impossible feature count";
    if (s->n_ckpts == s->cap_ckpts) {
        const int cap = s->cap_ckpts ? 2 * s->cap_ckpts : 16;
        store_ckpt *c = realloc(s->ckpts, (size_t)cap * sizeof *c);
        if (!c) return "out of memory";
        s->ckpts = c;
        s->cap_ckpts = cap;
    }
    s->ckpts[s->n_ckpts++] = (store_ckpt){g, pos, route, feat_count, buf};
    return NULL;
}

/* The largest payload a record of this shape can have (anything longer is refused unread). */
static uint64_t max_payload(const squad_store_shape *sh) {
    const uint64_t group = SQUAD_STORE_GROUP_FIXED + (uint64_t)sh->max_positions * (4 + sh->kv_bytes_per_pos);
    const uint64_t ckpt = SQUAD_STORE_CKPT_FIXED + (uint64_t)sh->feat_dim * 8 + sh->gdn_bytes;
    return group > ckpt ? group : ckpt;
}

/* Counts the records of a refused file, for the statistics (their headers only). */
static uint64_t count_records(FILE *f, uint64_t left) {
    uint64_t n = 0;
    uint8_t h[SQUAD_STORE_RECORD_BYTES];
    while (left >= sizeof h && fread(h, 1, sizeof h, f) == sizeof h) {
        left -= sizeof h;
        n++;
        const uint64_t len = get64(h + 8);
        if (get64(h + 24) != checksum(h, 24) || len > left || fseeko(f, (off_t)len, SEEK_CUR) != 0) break;
        left -= len;
    }
    return n ? n : 1;
}

squad_cache_snapshot *squad_store_read_stream(FILE *f, uint64_t size, const squad_store_shape *shape,
                                              const squad_cache_store_opts *opts, squad_cache_store_stats *st,
                                              squad_err *err) {
    squad_cache_snapshot *s = squad_calloc(1, sizeof *s, err);
    if (!s) return NULL;
    s->shape = *shape;
    uint8_t h[SQUAD_STORE_RECORD_BYTES > SQUAD_STORE_HEADER_BYTES ? SQUAD_STORE_RECORD_BYTES : SQUAD_STORE_HEADER_BYTES];
    if (size < SQUAD_STORE_HEADER_BYTES || fread(h, 1, SQUAD_STORE_HEADER_BYTES, f) != SQUAD_STORE_HEADER_BYTES) {
        store_log(opts, "cache file refused: shorter than its header");
        st->refused++;
        return s;
    }
    st->bytes += SQUAD_STORE_HEADER_BYTES;
    uint64_t left = size - SQUAD_STORE_HEADER_BYTES;
    const char *why = header_mismatch(h, shape);
    if (why) {
        const uint64_t n = count_records(f, left);
        store_log(opts, "cache file refused whole (%llu records): %s", (unsigned long long)n, why);
        st->refused += n;
        return s;
    }
    const uint64_t longest = max_payload(shape);
    for (uint64_t rec = 0;; rec++) {
        if (opts && opts->stop && opts->stop(opts->stop_ctx)) break;
        if (left == 0) break;
        if (left < SQUAD_STORE_RECORD_BYTES || fread(h, 1, SQUAD_STORE_RECORD_BYTES, f) != SQUAD_STORE_RECORD_BYTES) {
            store_log(opts, "cache record %llu refused: the file ends inside its header (truncated)",
                      (unsigned long long)rec);
            st->refused++;
            break;
        }
        left -= SQUAD_STORE_RECORD_BYTES;
        st->bytes += SQUAD_STORE_RECORD_BYTES;
        const uint32_t kind = get32(h + 4);
        const uint64_t len = get64(h + 8);
        if (get32(h) != SQUAD_STORE_RECORD_MAGIC || get64(h + 24) != checksum(h, 24)) {
            store_log(opts, "cache record %llu refused: its header is corrupt; the rest of the file cannot be found",
                      (unsigned long long)rec);
            st->refused++;
            break;
        }
        if (len > left) {
            store_log(opts, "cache record %llu refused: the file ends inside it (truncated)", (unsigned long long)rec);
            st->refused++;
            break;
        }
        if (len > longest || (kind != SQUAD_STORE_GROUP && kind != SQUAD_STORE_CKPT)) {
            store_log(opts, "cache record %llu refused: %s", (unsigned long long)rec,
                      len > longest ? "longer than any record of this model" : "of an unknown kind");
            st->refused++;
            if (fseeko(f, (off_t)len, SEEK_CUR) != 0) break;
            left -= len;
            continue;
        }
        uint8_t *buf = malloc(len ? (size_t)len : 1);
        if (!buf) {
            squad_fail(err, SQUAD_E_NOMEM, "cache load: out of memory for a %llu-byte record", (unsigned long long)len);
            squad_cache_snapshot_free(s);
            return NULL;
        }
        if (fread(buf, 1, (size_t)len, f) != (size_t)len) {
            free(buf);
            store_log(opts, "cache record %llu refused: cannot be read", (unsigned long long)rec);
            st->refused++;
            break;
        }
        left -= len;
        st->bytes += (size_t)len;
        why = get64(h + 16) != checksum(buf, (size_t)len) ? "its checksum fails (corrupt)"
              : kind == SQUAD_STORE_GROUP                 ? take_group(s, buf, len)
                                                          : take_ckpt(s, buf, len);
        if (why) {
            free(buf);
            store_log(opts, "cache record %llu refused: %s", (unsigned long long)rec, why);
            st->refused++;
        } else if (kind == SQUAD_STORE_GROUP) {
            st->groups++;
        } else {
            st->checkpoints++;
        }
    }
    return s;
}

squad_cache_snapshot *squad_store_read(const char *dir, const squad_store_shape *shape,
                                       const squad_cache_store_opts *opts, squad_cache_store_stats *st, squad_err *err) {
    const double t0 = squad_now_seconds();
    memset(st, 0, sizeof *st);
    char *path = squad_path_join(dir, SQUAD_STORE_FILE, err);
    if (!path) return NULL;
    FILE *f = fopen(path, "rb");
    struct stat sb;
    squad_cache_snapshot *s;
    if (!f || fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        if (f) store_log(opts, "cache file %s refused: not a regular file", path);
        if (f) st->refused++;
        s = squad_calloc(1, sizeof *s, err); /* nothing to load */
        if (s) s->shape = *shape;
    } else {
        s = squad_store_read_stream(f, (uint64_t)sb.st_size, shape, opts, st, err);
    }
    if (f) fclose(f);
    free(path);
    st->seconds = squad_now_seconds() - t0;
    return s;
}

int squad_store_snapshot_count(const squad_cache_snapshot *s) { return s ? s->n_ckpts : 0; }

void squad_store_adopt(squad_cache *cache, squad_cache_snapshot *s, squad_cache_store_stats *st) {
    const squad_store_shape *sh = &s->shape;
    const size_t feat_bytes = (size_t)sh->feat_dim * sizeof(double);
    for (int i = 0; i < s->n_ckpts; i++) {
        store_ckpt *k = &s->ckpts[i];
        store_group *g = &s->groups[k->group];
        const squad_cache_entry e = {
            .ids = (const int32_t *)(void *)(g->buf + SQUAD_STORE_GROUP_FIXED),
            .n_pos = g->n_pos,
            .group_route = g->route,
            .kv = g->buf + SQUAD_STORE_GROUP_FIXED + (size_t)g->n_pos * sizeof(int32_t),
            .kv_on_host = 1,
            .pos = k->pos,
            .gdn = k->buf + SQUAD_STORE_CKPT_FIXED + feat_bytes,
            .gdn_on_host = 1,
            .feat = sh->feat_dim ? (const double *)(void *)(k->buf + SQUAD_STORE_CKPT_FIXED) : NULL,
            .feat_count = k->feat_count,
            .route = k->route,
        };
        if (squad_cache_adopt(cache, &g->adopted, &e) == 1) st->checkpoints++;
        else st->skipped++;
        free(k->buf);
        k->buf = NULL;
    }
    s->n_ckpts = 0;
}

void squad_cache_snapshot_free(squad_cache_snapshot *s) {
    if (!s) return;
    for (int i = 0; i < s->n_groups; i++) free(s->groups[i].buf);
    for (int i = 0; i < s->n_ckpts; i++) free(s->ckpts[i].buf);
    free(s->groups);
    free(s->ckpts);
    free(s);
}
