/*
 * safetensors.c — a strict reader and a streaming writer for the safetensors format (see
 * safetensors.h).
 *
 * Reading: the whole file is mmapped read-only and st_parse validates the header before anything
 * points into the data: the 8-byte header length lies inside the file and under
 * ST_MAX_HEADER_BYTES, the header is a JSON object without duplicate keys, "__metadata__" holds
 * strings only, and every tensor has a known dtype, a shape of non-negative integers whose byte size
 * does not overflow, and data_offsets [begin, end] inside the data with end - begin equal to that
 * size. Tensors must not overlap (checked after sorting by offset). Gaps between tensors are
 * tolerated (they are harmless to a reader). Dtypes other than BF16/F16/F32 parse as ST_OTHER so a
 * checkpoint with, say, an int64 buffer still opens; binding a weight refuses them by name.
 *
 * Sets: a directory holds model.safetensors, or shards listed by model.safetensors.index.json
 * ({"weight_map": {tensor: shard}}). Shard names are plain file names (no '/', no ".."), each shard
 * is opened once, and every tensor of the weight map must be present in its shard. Lookup by name
 * goes through an open-addressing hash table of tensor pointers.
 *
 * Writing: st_writer writes the header (JSON, padded with spaces so the data starts at a multiple of
 * 8), then the tensors' bytes back to back in the given order — exactly what the reference
 * implementation expects — into a temporary file renamed onto the target at the end.
 */
#define _POSIX_C_SOURCE 200809L
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

#define ST_INDEX_NAME "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"

/* ---------------------------------------------------------------------------------------------
 * dtypes
 */

typedef struct st_dtype_info {
    const char *name;
    st_dtype dtype;
    size_t size;
} st_dtype_info;

/* Every dtype of the format whose element is a whole number of bytes. */
static const st_dtype_info ST_DTYPES[] = {
    {"BF16", ST_BF16, 2},    {"F16", ST_F16, 2},         {"F32", ST_F32, 4},         {"F64", ST_OTHER, 8},
    {"I64", ST_OTHER, 8},    {"U64", ST_OTHER, 8},       {"I32", ST_OTHER, 4},       {"U32", ST_OTHER, 4},
    {"I16", ST_OTHER, 2},    {"U16", ST_OTHER, 2},       {"I8", ST_OTHER, 1},        {"U8", ST_OTHER, 1},
    {"BOOL", ST_OTHER, 1},   {"F8_E4M3", ST_OTHER, 1},   {"F8_E5M2", ST_OTHER, 1},   {"F8_E8M0", ST_OTHER, 1},
    {"C64", ST_OTHER, 8},
};

static const st_dtype_info *dtype_lookup(const char *name) {
    for (size_t i = 0; i < sizeof ST_DTYPES / sizeof ST_DTYPES[0]; i++)
        if (!strcmp(ST_DTYPES[i].name, name)) return &ST_DTYPES[i];
    return NULL;
}

size_t st_dtype_size(st_dtype dt) {
    switch (dt) {
    case ST_BF16:
    case ST_F16: return 2;
    case ST_F32: return 4;
    default: return 0; /* ST_OTHER: the size depends on the actual dtype */
    }
}

static const char *dtype_name(st_dtype dt) {
    switch (dt) {
    case ST_BF16: return "BF16";
    case ST_F16: return "F16";
    case ST_F32: return "F32";
    default: return NULL;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Parsing one file image
 */

static uint64_t read_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static void free_tensors(st_tensor *t, int n) {
    if (!t) return;
    for (int i = 0; i < n; i++) free(t[i].name);
    free(t);
}

static int parse_metadata(json_t *meta, squad_err *err) {
    if (!json_is_object(meta)) return squad_fail(err, SQUAD_E_MODEL, "'__metadata__' must be an object");
    const char *k;
    json_t *v;
    json_object_foreach(meta, k, v) {
        if (!json_is_string(v))
            return squad_fail(err, SQUAD_E_MODEL, "'__metadata__' entry '%.100s' must be a string", k);
    }
    return 0;
}

/* Element count of a shape; fails on a bad dimension or on overflow of size_t bytes. */
static int parse_shape(json_t *shape, const char *name, size_t esize, st_tensor *t, size_t *nbytes, squad_err *err) {
    if (!json_is_array(shape))
        return squad_fail(err, SQUAD_E_MODEL, "tensor '%.200s': 'shape' must be an array", name);
    size_t nd = json_array_size(shape);
    if (nd > ST_MAX_DIMS)
        return squad_fail(err, SQUAD_E_MODEL, "tensor '%.200s': %zu dimensions (at most %d supported)", name, nd,
                          ST_MAX_DIMS);
    t->ndim = (int)nd;
    int zero = 0;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return squad_fail(err, SQUAD_E_MODEL, "tensor '%.200s': shape[%zu] must be a non-negative integer", name, i);
        t->shape[i] = (int64_t)json_integer_value(d);
        if (t->shape[i] == 0) zero = 1;
    }
    if (zero) {
        *nbytes = 0;
        return 0;
    }
    size_t total = esize;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d = (uint64_t)t->shape[i];
        if (d > SIZE_MAX / total)
            return squad_fail(err, SQUAD_E_MODEL, "tensor '%.200s': shape is too large (byte size overflows)", name);
        total *= (size_t)d;
    }
    *nbytes = total;
    return 0;
}

/* One tensor entry of the header. */
static int parse_tensor(const char *name, json_t *info, const uint8_t *data, size_t data_size, st_tensor *t,
                        size_t *begin_out, squad_err *err) {
    if (!json_is_object(info))
        return squad_fail(err, SQUAD_E_MODEL, "tensor '%.200s': entry must be an object", name);
    json_t *dt = json_object_get(info, "dtype");
    if (!json_is_string(dt)) return squad_fail(err, SQUAD_E_MODEL, "tensor '%.200s': 'dtype' must be a string", name);
    const st_dtype_info *di = dtype_lookup(json_string_value(dt));
    if (!di)
        return squad_fail(err, SQUAD_E_MODEL, "tensor '%.200s': unknown dtype '%.32s'", name, json_string_value(dt));
    t->dtype = di->dtype;
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", di->name);

    size_t nbytes = 0;
    if (parse_shape(json_object_get(info, "shape"), name, di->size, t, &nbytes, err) != 0) return err->code;

    json_t *off = json_object_get(info, "data_offsets");
    if (!json_is_array(off) || json_array_size(off) != 2 || !json_is_integer(json_array_get(off, 0)) ||
        !json_is_integer(json_array_get(off, 1)))
        return squad_fail(err, SQUAD_E_MODEL, "tensor '%.200s': 'data_offsets' must be [begin, end] integers", name);
    json_int_t b = json_integer_value(json_array_get(off, 0));
    json_int_t e = json_integer_value(json_array_get(off, 1));
    if (b < 0 || e < b || (uint64_t)e > (uint64_t)data_size)
        return squad_fail(err, SQUAD_E_MODEL,
                          "tensor '%.200s': data_offsets [%lld, %lld] are outside the data (%zu bytes)", name,
                          (long long)b, (long long)e, data_size);
    if ((uint64_t)(e - b) != (uint64_t)nbytes)
        return squad_fail(err, SQUAD_E_MODEL,
                          "tensor '%.200s': data_offsets span %lld bytes but dtype %s x shape needs %zu", name,
                          (long long)(e - b), di->name, nbytes);
    t->data = data + b;
    t->nbytes = nbytes;
    *begin_out = (size_t)b;
    return 0;
}

typedef struct st_span {
    size_t begin, end;
    int idx;
} st_span;

static int span_cmp(const void *a, const void *b) {
    const st_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* No two tensors with bytes may share a byte. */
static int check_overlaps(const st_tensor *t, const size_t *begins, int n, squad_err *err) {
    if (n < 2) return 0;
    st_span *sp = squad_calloc((size_t)n, sizeof *sp, err);
    if (!sp) return SQUAD_E_NOMEM;
    for (int i = 0; i < n; i++) {
        sp[i].begin = begins[i];
        sp[i].end = begins[i] + t[i].nbytes;
        sp[i].idx = i;
    }
    qsort(sp, (size_t)n, sizeof *sp, span_cmp);
    int rc = 0, last = -1; /* the last tensor with bytes, in offset order */
    for (int i = 0; i < n; i++) {
        if (sp[i].end == sp[i].begin) continue;
        if (last >= 0 && sp[i].begin < sp[last].end) {
            rc = squad_fail(err, SQUAD_E_MODEL, "tensors '%.150s' and '%.150s' overlap in the data",
                            t[sp[last].idx].name, t[sp[i].idx].name);
            break;
        }
        last = i;
    }
    free(sp);
    return rc;
}

int st_parse(const uint8_t *buf, size_t size, st_file *out, squad_err *err) {
    squad_err local;
    if (!err) err = &local; /* callers may pass NULL */
    memset(out, 0, sizeof *out); /* map and path belong to st_file_open, which fills them after */
    if (size < 8) return squad_fail(err, SQUAD_E_MODEL, "file is too small (%zu bytes) to hold a safetensors header", size);
    uint64_t hlen = read_le64(buf);
    if (hlen > ST_MAX_HEADER_BYTES)
        return squad_fail(err, SQUAD_E_MODEL, "header length %llu exceeds the limit of %u bytes",
                          (unsigned long long)hlen, ST_MAX_HEADER_BYTES);
    if (hlen > size - 8)
        return squad_fail(err, SQUAD_E_MODEL, "header length %llu runs past the end of the file (%zu bytes)",
                          (unsigned long long)hlen, size);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return squad_fail(err, SQUAD_E_MODEL, "header is not valid JSON (offset %d): %s", jerr.position, jerr.text);
    int rc = 0;
    st_tensor *tensors = NULL;
    size_t *begins = NULL;
    int n = 0;
    if (!json_is_object(root)) {
        rc = squad_fail(err, SQUAD_E_MODEL, "header is not a JSON object");
        goto done;
    }
    const uint8_t *data = buf + 8 + hlen;
    size_t data_size = size - 8 - (size_t)hlen;
    size_t cap = json_object_size(root);
    tensors = squad_calloc(cap, sizeof *tensors, err);
    begins = squad_calloc(cap, sizeof *begins, err);
    if (!tensors || !begins) {
        rc = SQUAD_E_NOMEM;
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) {
            if ((rc = parse_metadata(val, err)) != 0) goto done;
            continue;
        }
        st_tensor *t = &tensors[n];
        if ((rc = parse_tensor(key, val, data, data_size, t, &begins[n], err)) != 0) goto done;
        if (!(t->name = squad_strdup(key, err))) {
            rc = SQUAD_E_NOMEM;
            goto done;
        }
        n++;
    }
    rc = check_overlaps(tensors, begins, n, err);
done:
    json_decref(root);
    free(begins);
    if (rc != 0) {
        free_tensors(tensors, n);
        return rc;
    }
    out->tensors = tensors;
    out->n_tensors = n;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Files
 */

int st_file_open(st_file *f, const char *path, squad_err *err) {
    squad_err local;
    if (!err) err = &local; /* callers may pass NULL */
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return squad_fail(err, SQUAD_E_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return squad_fail(err, SQUAD_E_IO, "%s is not a regular file", path);
    }
    if ((uint64_t)st.st_size < 8) {
        close(fd);
        return squad_fail(err, SQUAD_E_MODEL, "%s: file is too small (%lld bytes) to be safetensors", path,
                          (long long)st.st_size);
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd); /* the mapping keeps the file */
    if (map == MAP_FAILED) return squad_fail(err, SQUAD_E_IO, "cannot map %s: %s", path, strerror(errno));
    if (st_parse(map, size, f, err) != 0) {
        munmap(map, size);
        return squad_fail_context(err, "%s: ", path);
    }
    f->map = map;
    f->map_size = size;
    if (!(f->path = squad_strdup(path, err))) {
        st_file_close(f);
        return SQUAD_E_NOMEM;
    }
    return 0;
}

void st_file_close(st_file *f) {
    if (!f) return;
    free_tensors(f->tensors, f->n_tensors);
    if (f->map) munmap(f->map, f->map_size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* ---------------------------------------------------------------------------------------------
 * Sets: the name index
 */

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* Builds set->slots over n tensors (names must be unique). */
static int set_build_index(st_set *set, const st_tensor **list, size_t n, squad_err *err) {
    size_t cap = 16;
    while (cap < 2 * n) {
        if (cap > SIZE_MAX / 4) return squad_fail(err, SQUAD_E_NOMEM, "too many tensors (%zu)", n);
        cap *= 2;
    }
    set->slots = squad_calloc(cap, sizeof *set->slots, err);
    if (!set->slots) return SQUAD_E_NOMEM;
    set->n_slots = cap;
    for (size_t i = 0; i < n; i++) {
        size_t j = (size_t)name_hash(list[i]->name) & (cap - 1);
        while (set->slots[j]) {
            if (!strcmp(set->slots[j]->name, list[i]->name))
                return squad_fail(err, SQUAD_E_MODEL, "tensor '%.200s' appears twice", list[i]->name);
            j = (j + 1) & (cap - 1);
        }
        set->slots[j] = list[i];
    }
    return 0;
}

const st_tensor *st_set_find(const st_set *set, const char *name) {
    if (!set || !set->n_slots) return NULL;
    size_t j = (size_t)name_hash(name) & (set->n_slots - 1);
    while (set->slots[j]) {
        if (!strcmp(set->slots[j]->name, name)) return set->slots[j];
        j = (j + 1) & (set->n_slots - 1);
    }
    return NULL;
}

void st_set_close(st_set *set) {
    if (!set) return;
    for (int i = 0; i < set->n_files; i++) st_file_close(&set->files[i]);
    free(set->files);
    free((void *)set->slots);
    memset(set, 0, sizeof *set);
}

static int open_single(st_set *set, const char *path, squad_err *err) {
    set->files = squad_calloc(1, sizeof *set->files, err);
    if (!set->files) return SQUAD_E_NOMEM;
    if (st_file_open(&set->files[0], path, err) != 0) return err->code;
    set->n_files = 1;
    st_file *f = &set->files[0];
    const st_tensor **list = squad_calloc((size_t)f->n_tensors, sizeof *list, err);
    if (!list) return SQUAD_E_NOMEM;
    for (int i = 0; i < f->n_tensors; i++) list[i] = &f->tensors[i];
    int rc = set_build_index(set, list, (size_t)f->n_tensors, err);
    free((void *)list);
    return rc;
}

/* One weight_map entry. */
typedef struct st_entry {
    const char *tensor;
    const char *shard;
    int file; /* index into set->files */
} st_entry;

static int entry_by_shard(const void *a, const void *b) {
    return strcmp(((const st_entry *)a)->shard, ((const st_entry *)b)->shard);
}

static int tensor_ptr_by_name(const void *a, const void *b) {
    return strcmp((*(const st_tensor *const *)a)->name, (*(const st_tensor *const *)b)->name);
}

/* A shard must be a plain file name inside the model directory. */
static int shard_name_ok(const char *s) {
    return s[0] != 0 && !strchr(s, '/') && !strchr(s, '\\') && !strstr(s, "..") && strlen(s) < 4096;
}

/* Finds name among a shard's tensors sorted by name. */
static const st_tensor *sorted_find(const st_tensor **sorted, int n, const char *name) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(sorted[mid]->name, name);
        if (c == 0) return sorted[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

/* Opens each distinct shard of entries[] (sorted by shard) once; sets entries[i].file. */
static int open_shards(st_set *set, const char *dir, st_entry *entries, size_t n, squad_err *err) {
    size_t distinct = 0;
    for (size_t i = 0; i < n; i++)
        if (i == 0 || strcmp(entries[i].shard, entries[i - 1].shard)) distinct++;
    set->files = squad_calloc(distinct, sizeof *set->files, err);
    if (!set->files) return SQUAD_E_NOMEM;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || strcmp(entries[i].shard, entries[i - 1].shard)) {
            char *path = squad_path_join(dir, entries[i].shard, err);
            if (!path) return SQUAD_E_NOMEM;
            int rc = st_file_open(&set->files[set->n_files], path, err);
            free(path);
            if (rc != 0) return squad_fail_context(err, "shard of %s: ", ST_INDEX_NAME);
            set->n_files++;
        }
        entries[i].file = set->n_files - 1;
    }
    return 0;
}

/* Resolves every entry to its tensor (in list[i]); a name missing from its shard is an error. */
static int resolve_entries(st_set *set, const st_entry *entries, size_t n, const st_tensor **list, squad_err *err) {
    int rc = 0;
    for (int fi = 0; fi < set->n_files && rc == 0; fi++) {
        st_file *f = &set->files[fi];
        const st_tensor **sorted = squad_calloc((size_t)f->n_tensors, sizeof *sorted, err);
        if (!sorted) return SQUAD_E_NOMEM;
        for (int i = 0; i < f->n_tensors; i++) sorted[i] = &f->tensors[i];
        qsort((void *)sorted, (size_t)f->n_tensors, sizeof *sorted, tensor_ptr_by_name);
        for (size_t i = 0; i < n; i++) {
            if (entries[i].file != fi) continue;
            list[i] = sorted_find(sorted, f->n_tensors, entries[i].tensor);
            if (!list[i]) {
                rc = squad_fail(err, SQUAD_E_MODEL, "%s: tensor '%.200s' is not in its shard %.200s", ST_INDEX_NAME,
                                entries[i].tensor, entries[i].shard);
                break;
            }
        }
        free((void *)sorted);
    }
    return rc;
}

static int open_index(st_set *set, const char *dir, const char *index_path, squad_err *err) {
    struct stat st;
    if (stat(index_path, &st) != 0) return squad_fail(err, SQUAD_E_IO, "cannot stat %s: %s", index_path, strerror(errno));
    if ((uint64_t)st.st_size > ST_MAX_HEADER_BYTES)
        return squad_fail(err, SQUAD_E_MODEL, "%s is too large (%lld bytes)", index_path, (long long)st.st_size);
    size_t len = 0;
    char *text = squad_read_file(index_path, &len, err);
    if (!text) return err->code;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root) return squad_fail(err, SQUAD_E_MODEL, "%s: invalid JSON at line %d: %s", index_path, jerr.line, jerr.text);

    int rc = 0;
    st_entry *entries = NULL;
    const st_tensor **list = NULL;
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm)) {
        rc = squad_fail(err, SQUAD_E_MODEL, "%s: missing object 'weight_map'", index_path);
        goto done;
    }
    size_t n = json_object_size(wm);
    entries = squad_calloc(n, sizeof *entries, err);
    list = squad_calloc(n, sizeof *list, err);
    if (!entries || !list) {
        rc = SQUAD_E_NOMEM;
        goto done;
    }
    size_t k = 0;
    const char *name;
    json_t *v;
    json_object_foreach(wm, name, v) {
        const char *shard = json_string_value(v);
        if (!shard) {
            rc = squad_fail(err, SQUAD_E_MODEL, "%s: weight_map['%.200s'] must be a file name string", index_path, name);
            goto done;
        }
        if (!shard_name_ok(shard)) {
            rc = squad_fail(err, SQUAD_E_MODEL, "%s: weight_map['%.200s'] names '%.200s', which is not a plain file name",
                            index_path, name, shard);
            goto done;
        }
        entries[k].tensor = name;
        entries[k].shard = shard;
        k++;
    }
    qsort(entries, n, sizeof *entries, entry_by_shard);
    if ((rc = open_shards(set, dir, entries, n, err)) != 0) goto done;
    if ((rc = resolve_entries(set, entries, n, list, err)) != 0) goto done;
    rc = set_build_index(set, list, n, err);
done:
    free(entries);
    free((void *)list);
    json_decref(root);
    return rc;
}

int st_set_open_dir(st_set *set, const char *dir, squad_err *err) {
    squad_err local;
    if (!err) err = &local; /* callers may pass NULL */
    memset(set, 0, sizeof *set);
    char *index_path = squad_path_join(dir, ST_INDEX_NAME, err);
    char *single_path = squad_path_join(dir, ST_SINGLE_NAME, err);
    int rc;
    if (!index_path || !single_path) {
        rc = SQUAD_E_NOMEM;
    } else if (access(index_path, F_OK) == 0) {
        rc = open_index(set, dir, index_path, err);
    } else if (access(single_path, F_OK) == 0) {
        rc = open_single(set, single_path, err);
    } else {
        rc = squad_fail(err, SQUAD_E_MODEL, "%s: no %s or %s", dir, ST_SINGLE_NAME, ST_INDEX_NAME);
    }
    free(index_path);
    free(single_path);
    if (rc != 0) st_set_close(set);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Writing
 */

struct st_writer {
    FILE *f;
    char *path;     /* the target */
    char *tmp_path; /* written first, renamed at close */
    uint64_t expected, written;
};

/* The header JSON (compact) for tensors laid out back to back; total data bytes in *data_bytes. */
static char *build_header(const st_write_tensor *tensors, int n, uint64_t *data_bytes, squad_err *err) {
    json_t *root = json_object();
    json_t *meta = json_object();
    char *text = NULL;
    /* json_*_set_new / append_new take the value even when they fail (NULL values included), so a
     * failed allocation anywhere shows up as a non-zero return. */
    if (!root || json_object_set_new(root, "__metadata__", meta) != 0 ||
        json_object_set_new(meta, "format", json_string("pt")) != 0) {
        if (!root) json_decref(meta);
        squad_fail(err, SQUAD_E_NOMEM, "out of memory building a safetensors header");
        goto done;
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const st_write_tensor *t = &tensors[i];
        const char *dn = dtype_name(t->dtype);
        if (!dn) {
            squad_fail(err, SQUAD_E_INVALID, "tensor '%.200s': only BF16, F16 and F32 can be written", t->name);
            goto done;
        }
        if (t->ndim < 0 || t->ndim > ST_MAX_DIMS) {
            squad_fail(err, SQUAD_E_INVALID, "tensor '%.200s': %d dimensions", t->name, t->ndim);
            goto done;
        }
        uint64_t bytes = st_dtype_size(t->dtype);
        json_t *shape = json_array();
        int bad = !shape;
        for (int d = 0; d < t->ndim && !bad; d++) {
            if (t->shape[d] < 0 || (t->shape[d] && bytes > UINT64_MAX / (uint64_t)t->shape[d])) {
                json_decref(shape);
                squad_fail(err, SQUAD_E_INVALID, "tensor '%.200s': bad shape", t->name);
                goto done;
            }
            bytes *= (uint64_t)t->shape[d];
            bad |= json_array_append_new(shape, json_integer(t->shape[d])) != 0;
        }
        json_t *info = json_object();
        json_t *offs = json_array();
        bad |= !info || !offs;
        bad |= json_array_append_new(offs, json_integer((json_int_t)off)) != 0;
        bad |= json_array_append_new(offs, json_integer((json_int_t)(off + bytes))) != 0;
        bad |= json_object_set_new(info, "dtype", json_string(dn)) != 0;
        bad |= json_object_set_new(info, "shape", shape) != 0;
        bad |= json_object_set_new(info, "data_offsets", offs) != 0;
        if (bad) {
            json_decref(info);
            squad_fail(err, SQUAD_E_NOMEM, "out of memory building a safetensors header");
            goto done;
        }
        if (!strcmp(t->name, "__metadata__") || json_object_get(root, t->name)) {
            json_decref(info);
            squad_fail(err, SQUAD_E_INVALID, "tensor name '%.200s' is reserved or given twice", t->name);
            goto done;
        }
        if (json_object_set_new(root, t->name, info) != 0) {
            squad_fail(err, SQUAD_E_INVALID, "tensor name '%.200s' is not valid UTF-8", t->name);
            goto done;
        }
        off += bytes;
    }
    text = json_dumps(root, JSON_COMPACT);
    if (!text) squad_fail(err, SQUAD_E_NOMEM, "out of memory writing a safetensors header");
    *data_bytes = off;
done:
    json_decref(root);
    return text;
}

st_writer *st_writer_open(const char *path, const st_write_tensor *tensors, int n, squad_err *err) {
    squad_err local;
    if (!err) err = &local; /* callers may pass NULL */
    uint64_t data_bytes = 0;
    char *header = build_header(tensors, n, &data_bytes, err);
    if (!header) return NULL;
    st_writer *w = squad_calloc(1, sizeof *w, err);
    size_t plen = strlen(path);
    if (w) w->path = squad_strdup(path, err);
    if (w && w->path) w->tmp_path = squad_malloc(plen + 8, err);
    if (!w || !w->path || !w->tmp_path) goto fail;
    snprintf(w->tmp_path, plen + 8, "%s.XXXXXX", path);
    int fd = mkstemp(w->tmp_path);
    if (fd < 0) {
        squad_fail(err, SQUAD_E_IO, "cannot create a file next to %s: %s", path, strerror(errno));
        free(w->tmp_path);
        w->tmp_path = NULL;
        goto fail;
    }
    fchmod(fd, 0644);
    w->f = fdopen(fd, "wb");
    if (!w->f) {
        close(fd);
        squad_fail(err, SQUAD_E_IO, "cannot open %s: %s", w->tmp_path, strerror(errno));
        goto fail;
    }
    /* Pad the header with spaces so the data starts at a multiple of 8. */
    size_t hlen = strlen(header);
    size_t padded = (hlen + 7) & ~(size_t)7;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int ok = fwrite(len8, 1, 8, w->f) == 8 && fwrite(header, 1, hlen, w->f) == hlen;
    for (size_t i = hlen; ok && i < padded; i++) ok = fputc(' ', w->f) != EOF;
    if (!ok) {
        squad_fail(err, SQUAD_E_IO, "cannot write %s: %s", w->tmp_path, strerror(errno));
        goto fail;
    }
    w->expected = data_bytes;
    free(header);
    return w;
fail:
    free(header);
    st_writer_abort(w);
    return NULL;
}

int st_writer_put(st_writer *w, const void *data, size_t nbytes, squad_err *err) {
    squad_err local;
    if (!err) err = &local; /* callers may pass NULL */
    if (nbytes > w->expected - w->written)
        return squad_fail(err, SQUAD_E_INVALID, "%s: more tensor data given than the header announces", w->path);
    if (nbytes && fwrite(data, 1, nbytes, w->f) != nbytes)
        return squad_fail(err, SQUAD_E_IO, "cannot write %s: %s", w->tmp_path, strerror(errno));
    w->written += nbytes;
    return 0;
}

int st_writer_close(st_writer *w, squad_err *err) {
    squad_err local;
    if (!err) err = &local; /* callers may pass NULL */
    int rc = 0;
    if (w->written != w->expected) {
        rc = squad_fail(err, SQUAD_E_INVALID, "%s: %llu of %llu data bytes given", w->path,
                        (unsigned long long)w->written, (unsigned long long)w->expected);
    } else {
        int bad = fflush(w->f) != 0 || ferror(w->f);
        bad |= fclose(w->f) != 0;
        w->f = NULL;
        if (bad)
            rc = squad_fail(err, SQUAD_E_IO, "cannot write %s: %s", w->tmp_path, strerror(errno));
        else if (rename(w->tmp_path, w->path) != 0)
            rc = squad_fail(err, SQUAD_E_IO, "cannot rename %s to %s: %s", w->tmp_path, w->path, strerror(errno));
        else {
            free(w->tmp_path);
            w->tmp_path = NULL; /* nothing left to remove */
        }
    }
    st_writer_abort(w);
    return rc;
}

void st_writer_abort(st_writer *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    if (w->tmp_path) {
        unlink(w->tmp_path);
        free(w->tmp_path);
    }
    free(w->path);
    free(w);
}

int st_write_file(const char *path, const st_write_tensor *tensors, int n, squad_err *err) {
    squad_err local;
    if (!err) err = &local; /* callers may pass NULL */
    st_writer *w = st_writer_open(path, tensors, n, err);
    if (!w) return err->code;
    for (int i = 0; i < n; i++) {
        size_t bytes = st_dtype_size(tensors[i].dtype);
        for (int d = 0; d < tensors[i].ndim; d++) bytes *= (size_t)tensors[i].shape[d];
        if (st_writer_put(w, tensors[i].data, bytes, err) != 0) {
            st_writer_abort(w);
            return err->code;
        }
    }
    return st_writer_close(w, err);
}
