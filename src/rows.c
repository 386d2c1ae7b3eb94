/*
 * rows.c — parsing rows from JSON lines with jansson (see rows.h). Every array element is checked to
 * be an integer in int32 range, so a hostile line gives a message, never a crash. A line is read by
 * squad's one JSON reader (json_text.h), and a field a row does not have is refused.
 */
#include "rows.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_text.h"
#include "util.h"

/* Reads an array of integers; the array is allocated (at least one element). */
static int int_array(json_t *root, const char *key, int required, int32_t **out, int *n, int max_n, squad_err *err) {
    *out = NULL;
    *n = 0;
    json_t *a = json_object_get(root, key);
    if (!a || json_is_null(a)) {
        if (required) return squad_fail(err, SQUAD_E_INVALID, "missing \"%s\"", key);
        return 0;
    }
    if (!json_is_array(a)) return squad_fail(err, SQUAD_E_INVALID, "\"%s\" must be an array of integers", key);
    size_t len = json_array_size(a);
    if (len > (size_t)max_n)
        return squad_fail(err, SQUAD_E_INVALID, "\"%s\" has %zu elements; at most %d", key, len, max_n);
    int32_t *v = squad_calloc(len ? len : 1, sizeof(int32_t), err);
    if (!v) return SQUAD_E_NOMEM;
    for (size_t i = 0; i < len; i++) {
        json_t *x = json_array_get(a, i);
        if (!json_is_integer(x)) {
            free(v);
            return squad_fail(err, SQUAD_E_INVALID, "\"%s\"[%zu] is not an integer", key, i);
        }
        json_int_t val = json_integer_value(x);
        if (val < INT32_MIN || val > INT32_MAX) {
            free(v);
            return squad_fail(err, SQUAD_E_INVALID, "\"%s\"[%zu] = %lld is out of range", key, i, (long long)val);
        }
        v[i] = (int32_t)val;
    }
    *out = v;
    *n = (int)len;
    return 0;
}

/* Hard cap on array lengths read from JSON (rows longer than the model supports fail later with a
 * precise message; this only bounds the memory a line can make us allocate). */
#define ROW_MAX_JSON_ELEMENTS (1 << 24)

/* The fields a row may have: any other is refused, as /v1/ask refuses a misspelt field. */
static const char *const ROW_FIELDS[] = {"ids", "slots", "nopts", "letters", "state_len", "specialist", "images", NULL};

/* Reads "images": an array of non-empty strings, at most SQUAD_MAX_IMAGES_PER_ROW. */
static int image_refs(json_t *root, squad_row_buf *out, squad_err *err) {
    json_t *a = json_object_get(root, "images");
    if (!a || json_is_null(a)) return 0;
    if (!json_is_array(a)) return squad_fail(err, SQUAD_E_INVALID, "\"images\" must be an array of strings");
    const size_t n = json_array_size(a);
    if (n > SQUAD_MAX_IMAGES_PER_ROW)
        return squad_fail(err, SQUAD_E_INVALID, "\"images\" has %zu entries; at most %d", n, SQUAD_MAX_IMAGES_PER_ROW);
    out->image_refs = squad_calloc(n ? n : 1, sizeof *out->image_refs, err);
    if (!out->image_refs) return SQUAD_E_NOMEM;
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(a, i);
        if (!json_is_string(x) || json_string_length(x) == 0)
            return squad_fail(err, SQUAD_E_INVALID, "\"images\"[%zu] must be a file path or a data: URL", i);
        if (!(out->image_refs[i] = squad_strdup(json_string_value(x), err))) return SQUAD_E_NOMEM;
        out->n_image_refs = (int)i + 1;
    }
    return 0;
}

int squad_row_parse_json(squad_row_buf *out, const char *text, size_t len, const int32_t *default_letters,
                         int n_default_letters, squad_err *err) {
    memset(out, 0, sizeof *out);
    json_t *root = squad_json_read_object(text, len, "the row", err); /* squad's one reader */
    if (!root) return err ? err->code : SQUAD_E_INVALID;
    int rc = squad_row_parse_value(out, root, default_letters, n_default_letters, err);
    json_decref(root);
    return rc;
}

int squad_row_parse_value(squad_row_buf *out, json_t *root, const int32_t *default_letters, int n_default_letters,
                          squad_err *err) {
    memset(out, 0, sizeof *out);
    int rc = 0;
    if (!json_is_object(root)) {
        rc = squad_fail(err, SQUAD_E_INVALID, "a row must be a JSON object");
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        int known = 0;
        for (int k = 0; ROW_FIELDS[k]; k++) known |= !strcmp(key, ROW_FIELDS[k]);
        if (!known) {
            rc = squad_fail(err, SQUAD_E_INVALID, "unknown field \"%.60s\" (a row has \"ids\", \"slots\", \"nopts\", "
                            "\"letters\", \"state_len\", \"specialist\" and \"images\")", key);
            goto done;
        }
    }
    int n_nopts = 0;
    if ((rc = int_array(root, "ids", 1, &out->ids, &out->row.n_ids, ROW_MAX_JSON_ELEMENTS, err))) goto done;
    if ((rc = int_array(root, "slots", 1, &out->slots, &out->row.n_slots, SQUAD_MAX_SLOTS_PER_ROW, err))) goto done;
    if ((rc = int_array(root, "nopts", 1, &out->nopts, &n_nopts, SQUAD_MAX_SLOTS_PER_ROW, err))) goto done;
    if (n_nopts != out->row.n_slots) {
        rc = squad_fail(err, SQUAD_E_INVALID, "\"nopts\" has %d entries but \"slots\" has %d", n_nopts, out->row.n_slots);
        goto done;
    }
    if ((rc = int_array(root, "letters", 0, &out->letters, &out->row.n_letters, SQUAD_MAX_LETTERS, err))) goto done;
    if (!out->letters) {
        if (!default_letters || n_default_letters < 1) {
            rc = squad_fail(err, SQUAD_E_INVALID, "missing \"letters\" (and the model has no template letters)");
            goto done;
        }
        out->letters = squad_calloc((size_t)n_default_letters, sizeof(int32_t), err);
        if (!out->letters) {
            rc = SQUAD_E_NOMEM;
            goto done;
        }
        memcpy(out->letters, default_letters, sizeof(int32_t) * (size_t)n_default_letters);
        out->row.n_letters = n_default_letters;
    }
    out->row.state_len = -1;
    json_t *sl = json_object_get(root, "state_len");
    if (sl && !json_is_null(sl)) {
        if (!json_is_integer(sl) || json_integer_value(sl) < 0 || json_integer_value(sl) > INT32_MAX) {
            rc = squad_fail(err, SQUAD_E_INVALID, "\"state_len\" must be a non-negative integer");
            goto done;
        }
        out->row.state_len = (int)json_integer_value(sl);
    }
    json_t *sp = json_object_get(root, "specialist");
    if (sp && !json_is_null(sp)) {
        if (!json_is_string(sp) || json_string_length(sp) == 0) {
            rc = squad_fail(err, SQUAD_E_INVALID, "\"specialist\" must be a label or \"auto\"");
            goto done;
        }
        if (strcmp(json_string_value(sp), "auto") != 0) {
            out->specialist = squad_strdup(json_string_value(sp), err);
            if (!out->specialist) {
                rc = SQUAD_E_NOMEM;
                goto done;
            }
        }
    }
    if ((rc = image_refs(root, out, err))) goto done;
    out->row.ids = out->ids;
    out->row.slots = out->slots;
    out->row.nopts = out->nopts;
    out->row.letters = out->letters;
done:
    if (rc) squad_row_buf_free(out);
    return rc;
}

void squad_row_buf_free(squad_row_buf *b) {
    free(b->ids);
    free(b->slots);
    free(b->nopts);
    free(b->letters);
    free(b->specialist);
    for (int i = 0; i < b->n_image_refs; i++) free(b->image_refs[i]);
    free(b->image_refs);
    memset(b, 0, sizeof *b);
}

int squad_row_expand_images(squad_row_buf *b, int image_token_id, squad_row_image *images, int n_images,
                            int max_tokens, squad_err *err) {
    squad_row *r = &b->row;
    for (int i = 0; i < r->n_slots; i++) /* the slots move with the images: they must be in order first */
        if (b->slots[i] < 0 || b->slots[i] >= r->n_ids || (i > 0 && b->slots[i] <= b->slots[i - 1]))
            return squad_fail(err, SQUAD_E_INVALID, "slots must be sorted, unique and inside the ids (slots[%d] = %d)", i,
                              b->slots[i]);
    int found = 0;
    long long n = r->n_ids;
    for (int i = 0; i < r->n_ids; i++) {
        if (r->ids[i] != image_token_id) continue;
        if (found == n_images)
            return squad_fail(err, SQUAD_E_INVALID, "ids hold more <|image_pad|> (%d) than the row has images (%d): "
                              "one per image", image_token_id, n_images);
        n += images[found++].tokens - 1;
    }
    if (found != n_images)
        return squad_fail(err, SQUAD_E_INVALID, "ids hold %d <|image_pad|> (%d) for %d images: one per image", found,
                          image_token_id, n_images);
    if (n > max_tokens)
        return squad_fail(err, SQUAD_E_INVALID, "the images make the row %lld tokens" SQUAD_ROW_TOO_LONG "%d", n,
                          max_tokens);
    int32_t *ids = squad_malloc((size_t)(n > 0 ? n : 1) * sizeof *ids, err);
    if (!ids) return SQUAD_E_NOMEM;
    int o = 0, k = 0, s = 0, state_len = r->state_len;
    for (int i = 0; i < r->n_ids; i++) {
        const int pad = r->ids[i] == image_token_id, len = pad ? images[k].tokens : 1;
        /* a slot answers after its token: after an image, after its whole run */
        for (; s < r->n_slots && b->slots[s] == i; s++) b->slots[s] = o + len - 1;
        if (i == r->state_len) state_len = o; /* the state is the tokens before index i */
        if (!pad) {
            ids[o++] = r->ids[i];
            continue;
        }
        images[k].pos = o;
        for (int j = 0; j < len; j++) ids[o++] = image_token_id;
        k++;
    }
    if (r->state_len >= r->n_ids) state_len = o + (r->state_len - r->n_ids);
    free(b->ids);
    b->ids = ids;
    r->ids = ids;
    r->n_ids = o;
    r->state_len = state_len;
    r->images = images;
    r->n_images = n_images;
    return 0;
}

void squad_row_limit_name(squad_err *err, const char *limit) {
    if (!err || !limit || !strstr(err->msg, SQUAD_ROW_TOO_LONG)) return;
    const size_t n = strlen(err->msg);
    snprintf(err->msg + n, sizeof err->msg - n, " (%s)", limit);
}
