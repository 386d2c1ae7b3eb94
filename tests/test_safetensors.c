/*
 * test_safetensors.c — the safetensors reader and writer: a round trip through st_write_file and
 * the streaming writer, hand-made corrupt or hostile files (truncated, header length past the
 * file or over the limit, overlapping tensors, size mismatch, unknown dtypes, shape overflow,
 * duplicate names, non-object headers...) that must all fail cleanly with a message, and sharded
 * sets through model.safetensors.index.json, including shard names that try to leave the directory.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "safetensors.h"
#include "testutil.h"
#include "util.h"

static char g_dir[256];

static const char *path_in(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) & 3;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fwrite(data, 1, n, f);
    fclose(f);
}

static void write_text(const char *path, const char *text) { write_bytes(path, text, strlen(text)); }

/* A file image: 8-byte length (or `hlen_override` when not ~0), the header, data_size zero bytes. */
static uint8_t *make_image(const char *header, size_t data_size, uint64_t hlen_override, size_t *size) {
    size_t hl = strlen(header);
    *size = 8 + hl + data_size;
    uint8_t *buf = calloc(1, *size);
    uint64_t v = hlen_override != ~(uint64_t)0 ? hlen_override : hl;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(v >> (8 * i));
    memcpy(buf + 8, header, hl);
    return buf;
}

/* st_parse of a hand-made image must fail with a message containing needle (and not crash). */
static void expect_bad(const char *header, size_t data_size, const char *needle) {
    size_t size;
    uint8_t *img = make_image(header, data_size, ~(uint64_t)0, &size);
    st_file f;
    memset(&f, 0, sizeof f);
    squad_err e = {0};
    int rc = st_parse(img, size, &f, &e);
    CHECKF(rc != 0 && strstr(e.msg, needle), "header %s: rc %d msg '%s' (wanted '%s')", header, rc,
           rc ? e.msg : "", needle);
    CHECK(f.tensors == NULL && f.n_tensors == 0);
    if (rc == 0) st_file_close(&f);
    free(img);
}

static void expect_good(const char *header, size_t data_size, int n_tensors) {
    size_t size;
    uint8_t *img = make_image(header, data_size, ~(uint64_t)0, &size);
    st_file f;
    memset(&f, 0, sizeof f);
    squad_err e = {0};
    int rc = st_parse(img, size, &f, &e);
    CHECKF(rc == 0 && f.n_tensors == n_tensors, "header %s: rc %d msg '%s'", header, rc, e.msg);
    st_file_close(&f);
    free(img);
}

static void test_round_trip(void) {
    uint16_t a[6], h[4];
    float c[3] = {1.5f, -2.25f, 3e-5f};
    for (int i = 0; i < 6; i++) a[i] = squad_f32_to_bf16((float)i - 2.5f);
    for (int i = 0; i < 4; i++) h[i] = (uint16_t)(0x3c00 + i); /* f16 1.0 and neighbours */
    float scalar = 7.0f;
    st_write_tensor t[5] = {
        {"model.a", ST_BF16, 2, {2, 3}, a},
        {"h\"quoted\\name", ST_F16, 3, {1, 2, 2}, h},
        {"c", ST_F32, 1, {3}, c},
        {"empty", ST_F32, 2, {0, 5}, NULL},
        {"scalar", ST_F32, 0, {0}, &scalar},
    };
    const char *p = path_in("rt.safetensors");
    squad_err e = {0};
    CHECKF(st_write_file(p, t, 5, &e) == 0, "%s", e.msg);
    st_file f;
    int rc = st_file_open(&f, p, &e);
    CHECKF(rc == 0, "%s", e.msg);
    if (rc != 0) return;
    CHECK(f.n_tensors == 5);
    const uint8_t *base = f.map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | base[i];
    CHECK((8 + hlen) % 8 == 0);
    for (int k = 0; k < 5; k++) {
        const st_tensor *x = NULL;
        for (int i = 0; i < f.n_tensors; i++)
            if (!strcmp(f.tensors[i].name, t[k].name)) x = &f.tensors[i];
        CHECKF(x != NULL, "tensor %s not read back", t[k].name);
        if (!x) continue;
        CHECK(x->dtype == t[k].dtype && x->ndim == t[k].ndim);
        size_t n = st_dtype_size(t[k].dtype);
        for (int d = 0; d < x->ndim; d++) {
            CHECK(x->shape[d] == t[k].shape[d]);
            n *= (size_t)t[k].shape[d];
        }
        CHECK(x->nbytes == n);
        if (n) CHECK(memcmp(x->data, t[k].data, n) == 0);
    }
    /* Tensors are back to back from the start of the data (the reference reader insists). */
    CHECK((const uint8_t *)f.tensors[0].data == base + 8 + hlen);
    st_file_close(&f);

    /* Writing twice gives byte-identical files. */
    size_t n1, n2;
    char *b1 = squad_read_file(p, &n1, &e);
    CHECK(st_write_file(path_in("rt2.safetensors"), t, 5, &e) == 0);
    char *b2 = squad_read_file(path_in("rt2.safetensors"), &n2, &e);
    CHECK(b1 && b2 && n1 == n2 && memcmp(b1, b2, n1) == 0);
    free(b1);
    free(b2);

    /* Every truncation of a valid file fails cleanly. */
    size_t size;
    uint8_t *img = (uint8_t *)squad_read_file(p, &size, &e);
    int clean = 1;
    for (size_t cut = 0; cut < size; cut++) {
        st_file g;
        squad_err e2 = {0};
        if (st_parse(img, cut, &g, &e2) == 0) {
            clean = 0;
            st_file_close(&g);
        } else if (!e2.msg[0]) {
            clean = 0;
        }
    }
    CHECK(clean);
    write_bytes(path_in("trunc.safetensors"), img, size - 3);
    CHECK(st_file_open(&f, path_in("trunc.safetensors"), &e) != 0 && strstr(e.msg, "trunc.safetensors") &&
          strstr(e.msg, "outside the data"));
    write_bytes(path_in("tiny.safetensors"), img, 5);
    CHECK(st_file_open(&f, path_in("tiny.safetensors"), &e) != 0 && strstr(e.msg, "too small"));
    free(img);
    CHECK(st_file_open(&f, path_in("absent.safetensors"), &e) != 0 && strstr(e.msg, "absent.safetensors"));
    CHECK(st_file_open(&f, g_dir, &e) != 0); /* a directory */
}

static void test_writer(void) {
    float data[10];
    for (int i = 0; i < 10; i++) data[i] = (float)i;
    st_write_tensor t[2] = {{"x", ST_F32, 1, {4}, NULL}, {"y", ST_F32, 2, {2, 3}, NULL}};
    squad_err e = {0};
    const char *p = path_in("stream.safetensors");
    st_writer *w = st_writer_open(p, t, 2, &e);
    CHECKF(w != NULL, "%s", e.msg);
    if (!w) return;
    /* Arbitrary piece sizes across tensor boundaries. */
    CHECK(st_writer_put(w, data, 3 * 4, &e) == 0);
    CHECK(st_writer_put(w, data + 3, 5 * 4, &e) == 0);
    CHECK(access(p, F_OK) != 0); /* nothing at the target until close */
    CHECK(st_writer_put(w, data + 8, 3 * 4, &e) != 0 && strstr(e.msg, "more tensor data"));
    CHECK(st_writer_put(w, data + 8, 2 * 4, &e) == 0);
    CHECKF(st_writer_close(w, &e) == 0, "%s", e.msg);
    st_file f;
    CHECK(st_file_open(&f, p, &e) == 0 && f.n_tensors == 2);
    if (f.n_tensors == 2) CHECK(memcmp(f.tensors[1].data, data + 4, 24) == 0);
    st_file_close(&f);

    /* Closing early is an error and leaves no file. */
    const char *q = path_in("short.safetensors");
    w = st_writer_open(q, t, 2, &e);
    CHECK(w && st_writer_put(w, data, 8, &e) == 0);
    CHECK(w && st_writer_close(w, &e) != 0 && strstr(e.msg, "data bytes"));
    CHECK(access(q, F_OK) != 0);
    w = st_writer_open(q, t, 2, &e);
    st_writer_abort(w);
    CHECK(access(q, F_OK) != 0);

    /* Bad requests. */
    st_write_tensor dup[2] = {{"x", ST_F32, 1, {1}, data}, {"x", ST_F32, 1, {1}, data}};
    CHECK(st_write_file(q, dup, 2, &e) != 0 && strstr(e.msg, "twice"));
    st_write_tensor other = {"o", ST_OTHER, 1, {1}, data};
    CHECK(st_write_file(q, &other, 1, &e) != 0 && strstr(e.msg, "'o'"));
    st_write_tensor meta = {"__metadata__", ST_F32, 1, {1}, data};
    CHECK(st_write_file(q, &meta, 1, &e) != 0);
    CHECK(st_write_file("/nonexistent-dir/x.safetensors", t, 1, &e) != 0 && strstr(e.msg, "nonexistent-dir"));
}

static void test_corrupt_headers(void) {
    /* Valid baselines: one tensor, metadata, other dtypes still parse. */
    expect_good("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 1);
    expect_good("{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]}}",
                8, 1);
    expect_good("{}", 0, 0);
    expect_good("{\"a\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[0,24]},"
                "\"b\":{\"dtype\":\"F8_E4M3\",\"shape\":[3],\"data_offsets\":[24,27]},"
                "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[5,5]}}  ",
                32, 3);
    {
        size_t size;
        uint8_t *img = make_image("{\"a\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[0,24]}}", 24,
                                  ~(uint64_t)0, &size);
        st_file f;
        squad_err e;
        CHECK(st_parse(img, size, &f, &e) == 0 && f.tensors[0].dtype == ST_OTHER &&
              !strcmp(f.tensors[0].dtype_name, "I64"));
        st_file_close(&f);
        free(img);
    }

    /* Header length beyond the file, or above the limit. */
    {
        size_t size;
        const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
        uint8_t *img = make_image(h, 8, strlen(h) + 9, &size);
        st_file f;
        squad_err e = {0};
        CHECK(st_parse(img, size, &f, &e) != 0 && strstr(e.msg, "past the end"));
        free(img);
        img = make_image(h, 8, (uint64_t)ST_MAX_HEADER_BYTES + 1, &size);
        CHECK(st_parse(img, size, &f, &e) != 0 && strstr(e.msg, "limit"));
        free(img);
        img = make_image(h, 8, ~(uint64_t)0 - 1, &size);
        CHECK(st_parse(img, size, &f, &e) != 0 && strstr(e.msg, "limit"));
        free(img);
    }

    expect_bad("[]", 0, "not a JSON object");
    expect_bad("[1,2]", 0, "not a JSON object");
    expect_bad("{\"a\": ", 0, "not valid JSON");
    expect_bad("", 0, "not valid JSON");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               8, "duplicate");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               12, "overlap");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
               8, "overlap");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 12, "needs 12");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,16]}}", 8, "outside the data");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "outside the data");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8, "outside the data");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, "data_offsets");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8.0]}}", 8, "data_offsets");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "data_offsets");
    expect_bad("{\"a\":{\"dtype\":\"Q4_K\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype 'Q4_K'");
    expect_bad("{\"a\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "dtype");
    expect_bad("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "dtype");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "shape[0]");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8, "shape[0]");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, "shape");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}", 8, "dimensions");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
               "overflow");
    expect_bad("{\"a\":{\"dtype\":\"F64\",\"shape\":[9223372036854775807],\"data_offsets\":[0,8]}}", 8, "overflow");
    expect_bad("{\"a\":{\"dtype\":\"BF16\",\"shape\":[4611686018427387904,2],\"data_offsets\":[0,8]}}", 8,
               "overflow");
    expect_bad("{\"a\":[1,2,3]}", 8, "entry must be an object");
    expect_bad("{\"__metadata__\":{\"format\":1}}", 0, "__metadata__");
    expect_bad("{\"__metadata__\":[]}", 0, "__metadata__");
    /* A NUL inside the header is not JSON. */
    {
        size_t size;
        uint8_t *img = make_image("{\"a\":{}}", 0, ~(uint64_t)0, &size);
        img[9] = 0;
        st_file f;
        squad_err e = {0};
        CHECK(st_parse(img, size, &f, &e) != 0);
        free(img);
    }
    /* A NULL err is allowed. */
    st_file f;
    CHECK(st_parse((const uint8_t *)"abc", 3, &f, NULL) != 0);
}

/* Writes a small set of shards plus an index naming them. */
static void write_shards(void) {
    float a[4] = {1, 2, 3, 4}, b[2] = {5, 6}, c[3] = {7, 8, 9};
    st_write_tensor s1[2] = {{"a", ST_F32, 1, {4}, a}, {"extra", ST_F32, 1, {2}, b}};
    st_write_tensor s2[2] = {{"b", ST_F32, 1, {2}, b}, {"c", ST_F32, 1, {3}, c}};
    squad_err e;
    CHECK(st_write_file(path_in("shard-1.safetensors"), s1, 2, &e) == 0);
    CHECK(st_write_file(path_in("shard-2.safetensors"), s2, 2, &e) == 0);
}

static void test_sets(void) {
    st_set set;
    squad_err e = {0};
    /* Neither file. */
    CHECK(st_set_open_dir(&set, g_dir, &e) != 0 && strstr(e.msg, "model.safetensors"));

    /* A single file. */
    float x[2] = {1, 2};
    st_write_tensor t[2] = {{"model.x", ST_F32, 1, {2}, x}, {"model.y", ST_F32, 1, {1}, x}};
    CHECK(st_write_file(path_in("model.safetensors"), t, 2, &e) == 0);
    CHECKF(st_set_open_dir(&set, g_dir, &e) == 0, "%s", e.msg);
    CHECK(set.n_files == 1);
    const st_tensor *tx = st_set_find(&set, "model.x");
    CHECK(tx && tx->shape[0] == 2 && ((const float *)tx->data)[1] == 2.0f);
    CHECK(st_set_find(&set, "model.y") != NULL);
    CHECK(st_set_find(&set, "model.z") == NULL);
    CHECK(st_set_find(&set, "") == NULL);
    st_set_close(&set);

    /* Shards through the index (it wins over model.safetensors). */
    write_shards();
    write_text(path_in("model.safetensors.index.json"),
               "{\"metadata\": {\"total_size\": 36}, \"weight_map\": {\"a\": \"shard-1.safetensors\","
               " \"b\": \"shard-2.safetensors\", \"c\": \"shard-2.safetensors\"}}");
    CHECKF(st_set_open_dir(&set, g_dir, &e) == 0, "%s", e.msg);
    CHECK(set.n_files == 2);
    const st_tensor *tc = st_set_find(&set, "c");
    CHECK(tc && tc->shape[0] == 3 && ((const float *)tc->data)[2] == 9.0f);
    CHECK(st_set_find(&set, "a") && st_set_find(&set, "b"));
    CHECK(st_set_find(&set, "extra") == NULL); /* only what the weight map lists */
    CHECK(st_set_find(&set, "model.x") == NULL);
    st_set_close(&set);

    struct {
        const char *index;
        const char *needle;
    } bad[] = {
        {"{\"weight_map\": {\"a\": \"../shard-1.safetensors\"}}", "not a plain file name"},
        {"{\"weight_map\": {\"a\": \"sub/shard-1.safetensors\"}}", "not a plain file name"},
        {"{\"weight_map\": {\"a\": \"/etc/passwd\"}}", "not a plain file name"},
        {"{\"weight_map\": {\"a\": \"..\"}}", "not a plain file name"},
        {"{\"weight_map\": {\"a\": \"\"}}", "not a plain file name"},
        {"{\"weight_map\": {\"a\": 3}}", "weight_map['a']"},
        {"{\"weight_map\": {\"a\": \"missing.safetensors\"}}", "missing.safetensors"},
        {"{\"weight_map\": {\"b\": \"shard-1.safetensors\"}}", "'b' is not in its shard shard-1.safetensors"},
        {"{\"weight_map\": [\"a\"]}", "weight_map"},
        {"{\"metadata\": {}}", "weight_map"},
        {"[]", "weight_map"},
        {"{\"weight_map\": ", "invalid JSON"},
        {"{\"weight_map\": {\"a\": \"shard-1.safetensors\", \"a\": \"shard-2.safetensors\"}}", "duplicate"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(path_in("model.safetensors.index.json"), bad[i].index);
        memset(&e, 0, sizeof e);
        int rc = st_set_open_dir(&set, g_dir, &e);
        CHECKF(rc != 0 && strstr(e.msg, bad[i].needle), "index %s: rc %d msg '%s'", bad[i].index, rc, e.msg);
        CHECK(set.files == NULL && set.n_files == 0);
    }
    /* A corrupt shard names the shard. */
    write_text(path_in("shard-3.safetensors"), "garbage that is not safetensors");
    write_text(path_in("model.safetensors.index.json"), "{\"weight_map\": {\"a\": \"shard-3.safetensors\"}}");
    CHECK(st_set_open_dir(&set, g_dir, &e) != 0 && strstr(e.msg, "shard-3.safetensors"));
    /* An empty weight map is an empty set. */
    write_text(path_in("model.safetensors.index.json"), "{\"weight_map\": {}}");
    CHECK(st_set_open_dir(&set, g_dir, &e) == 0 && st_set_find(&set, "a") == NULL);
    st_set_close(&set);
    st_set_close(&set); /* closing twice is harmless */
}

static void cleanup(void) {
    const char *names[] = {"rt.safetensors", "rt2.safetensors", "trunc.safetensors", "tiny.safetensors",
                           "stream.safetensors", "model.safetensors", "shard-1.safetensors", "shard-2.safetensors",
                           "shard-3.safetensors", "model.safetensors.index.json"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) remove(path_in(names[i]));
    rmdir(g_dir);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "%s", test_tmpdir());
    test_round_trip();
    test_writer();
    test_corrupt_headers();
    test_sets();
    cleanup();
    return test_summary("test_safetensors");
}
