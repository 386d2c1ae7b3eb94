/*
 * fuzz_safetensors.c — libFuzzer target for the safetensors header parser (st_parse).
 *
 * Each input is tried two ways: as a whole file image (8-byte length, header, data), and — so the
 * fuzzer spends its time inside the JSON validation rather than guessing a consistent length — as
 * a header: the first two bytes give a data size (0..4095), the rest is the header text, and the
 * image is assembled around it. Whatever parses must describe tensors that lie inside the image.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

/* Every tensor of a parsed image must lie inside it and match its dtype x shape. */
static void check_parsed(const st_file *f, const uint8_t *buf, size_t size) {
    for (int i = 0; i < f->n_tensors; i++) {
        const st_tensor *t = &f->tensors[i];
        const uint8_t *p = t->data;
        if (p < buf + 8 || p > buf + size || t->nbytes > (size_t)(buf + size - p)) __builtin_trap();
        if (t->ndim < 0 || t->ndim > ST_MAX_DIMS || !t->name) __builtin_trap();
        size_t es = st_dtype_size(t->dtype);
        if (es) {
            size_t n = es;
            for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
            if (n != t->nbytes) __builtin_trap();
        }
        if (t->nbytes) {
            volatile uint8_t sink = p[0] ^ p[t->nbytes - 1]; /* touch both ends (ASan checks) */
            (void)sink;
        }
    }
}

static void try_image(const uint8_t *buf, size_t size) {
    st_file f;
    squad_err err;
    err.msg[0] = 0;
    if (st_parse(buf, size, &f, &err) == 0) {
        check_parsed(&f, buf, size);
        st_file_close(&f);
    } else if (!err.msg[0]) {
        __builtin_trap(); /* every failure explains itself */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    try_image(data, size);
    if (size < 2) return 0;
    size_t data_size = ((size_t)data[0] | ((size_t)data[1] << 8)) & 4095;
    size_t hlen = size - 2;
    size_t total = 8 + hlen + data_size;
    uint8_t *img = malloc(total);
    if (!img) return 0;
    for (int i = 0; i < 8; i++) img[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    memcpy(img + 8, data + 2, hlen);
    for (size_t i = 0; i < data_size; i++) img[8 + hlen + i] = (uint8_t)i;
    try_image(img, total);
    free(img);
    return 0;
}
