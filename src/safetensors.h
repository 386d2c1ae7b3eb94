/*
 * safetensors.h — a strict reader for the safetensors format (single file or shards).
 *
 * A file is 8 bytes of little-endian header length, a JSON header mapping tensor names to
 * {dtype, shape, data_offsets}, then the data. Files are mmapped read-only; tensors point into the
 * map. Validation is strict because files may be hostile: the header size is bounded, every
 * offset lies inside the data, nbytes equals dtype size x shape product, tensors do not overlap.
 * Sharded checkpoints are read through model.safetensors.index.json.
 */
#ifndef SQUAD_SAFETENSORS_H
#define SQUAD_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "squad.h"

/* The largest header accepted (the format's own limit is 100 MB). */
#define ST_MAX_HEADER_BYTES (100u * 1024u * 1024u)
#define ST_MAX_DIMS 8

typedef enum { ST_BF16 = 0, ST_F16 = 1, ST_F32 = 2, ST_OTHER = 3 } st_dtype;

typedef struct st_tensor {
    char *name;
    st_dtype dtype;
    char dtype_name[16]; /* as written in the header (for messages about ST_OTHER) */
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data; /* inside the file's map */
    size_t nbytes;
} st_tensor;

typedef struct st_file {
    char *path;
    void *map;
    size_t map_size;
    st_tensor *tensors;
    int n_tensors;
} st_file;

/* Parses a whole safetensors image in memory (buf, size): initialises *out (tensors pointing into buf;
 * map and path left empty; release with st_file_close).
 * Used by st_file_open and by the fuzz target. */
int st_parse(const uint8_t *buf, size_t size, st_file *out, squad_err *err);
int st_file_open(st_file *f, const char *path, squad_err *err);
void st_file_close(st_file *f);

/* A model's tensors across one or more files, looked up by name through a hash index. */
typedef struct st_set {
    st_file *files;
    int n_files;
    const st_tensor **slots; /* open-addressing table of tensor pointers */
    size_t n_slots;
} st_set;

/* Opens dir/model.safetensors, or the shards named by dir/model.safetensors.index.json. */
int st_set_open_dir(st_set *set, const char *dir, squad_err *err);
void st_set_close(st_set *set);
const st_tensor *st_set_find(const st_set *set, const char *name);

size_t st_dtype_size(st_dtype dt);

/* Writing (squad synth, tests): tensors given as name, dtype, shape and data. */
typedef struct st_write_tensor {
    const char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;
} st_write_tensor;
int st_write_file(const char *path, const st_write_tensor *tensors, int n, squad_err *err);

/* Streaming writer (squad synth writes a 1.6 GB checkpoint without holding it in memory): open
 * writes the header for tensors (their data fields are ignored), put appends the next bytes of the
 * tensors' data in the given order (any piece size), close checks that every byte was given and
 * renames the temporary file onto path. abort (also after a failed put) removes the temporary file.
 * The file appears at path only when close succeeds. */
typedef struct st_writer st_writer;
st_writer *st_writer_open(const char *path, const st_write_tensor *tensors, int n, squad_err *err);
int st_writer_put(st_writer *w, const void *data, size_t nbytes, squad_err *err);
int st_writer_close(st_writer *w, squad_err *err);
void st_writer_abort(st_writer *w);

#endif /* SQUAD_SAFETENSORS_H */
