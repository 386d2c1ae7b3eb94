/*
 * template.c — text requests to rows through the prompt template (see template.h).
 *
 * Design: each template string is parsed once into segments (literal text and {placeholders}).
 * Rendering feeds a token builder: literal template text is scanned for added tokens (the chat markup
 * such as <|im_start|>), which are emitted as their ids; the text between them, template text and
 * request text alike, is collected and tokenised in one piece with added tokens disabled, so request
 * text can never produce a special token and the result equals what Hugging Face gives for the whole
 * rendered string whenever the request contains no special-token text. The builder is flushed at the
 * end of the prefix (so the state's tokens do not depend on what follows) and at the end of each cue
 * (so an answer slot's tokens do not depend on what follows it).
 */
#define _POSIX_C_SOURCE 200809L
#include "template.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "image/loader.h"
#include "rows.h"
#include "token_builder.h"
#include "util.h"

enum { PH_NONE = -1, PH_SYSTEM, PH_STATE, PH_QUESTION, PH_LABEL, PH_OPTION, PH_IMAGE, PH_COUNT };
static const char *const PH_NAMES[PH_COUNT] = {"system", "state", "question", "label", "option", "image"};

enum { PART_SYSTEM, PART_PREFIX, PART_QUESTION, PART_OPTION, PART_CUE, PART_SEPARATOR, PART_IMAGE, N_PARTS };
static const char *const PART_NAMES[N_PARTS] = {"system", "prefix", "question", "option", "cue", "separator", "image"};
/* The placeholders each part may use, and those it must use exactly once (system: when non-empty). */
static const unsigned PART_ALLOWED[N_PARTS] = {1u << PH_SYSTEM, 1u << PH_STATE, 1u << PH_QUESTION,
                                               (1u << PH_LABEL) | (1u << PH_OPTION), 0, 0, 1u << PH_IMAGE};
static const unsigned PART_REQUIRED[N_PARTS] = {1u << PH_SYSTEM, 1u << PH_STATE, 1u << PH_QUESTION, 1u << PH_OPTION,
                                                0, 0, 1u << PH_IMAGE};

/* The default template (README.md, "Prompt template", must say exactly this). */
static const char *const DEFAULT_PARTS[N_PARTS] = {
    "<|im_start|>system\n{system}<|im_end|>\n",
    "<|im_start|>user\n{state}\n\n",
    "Question: {question}\n",
    "{label}. {option}\n",
    "Answer with the letter of the correct option.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nAnswer:",
    "<|im_end|>\n<|im_start|>user\n",
    SQUAD_VISION_START_TOKEN "{image}" SQUAD_VISION_END_TOKEN, /* Qwen2-VL's markup; {image}: the pad run */
};
#define DEFAULT_QUESTIONS_PER_ROW 1
/* Every row holds its own copy of the prefix: a bound on all rows' tokens together keeps a huge
 * state times many questions from exhausting memory (64 M ids = 256 MB). */
#define MAX_TOTAL_IDS ((size_t)1 << 26)
#define LETTER_MAX 32 /* bytes of a letter's text, with its NUL */

typedef struct tpl_seg {
    int ph; /* PH_NONE: literal text */
    char *lit;
    size_t len;
} tpl_seg;

typedef struct tpl_part {
    tpl_seg *segs;
    int n;
} tpl_part;

struct squad_template {
    tpl_part parts[N_PARTS];
    int n_letters;
    char labels[SQUAD_MAX_LETTERS][SQUAD_LABEL_MAX];
    char letters[SQUAD_MAX_LETTERS][LETTER_MAX];
    int questions_per_row;
};

/* ---------------------------------------------------------------------------------------------
 * Template parsing
 * ------------------------------------------------------------------------------------------- */

static void part_free(tpl_part *p) {
    for (int i = 0; i < p->n; i++) free(p->segs[i].lit);
    free(p->segs);
    p->segs = NULL;
    p->n = 0;
}

static int part_push(tpl_part *p, int ph, const char *lit, size_t len, squad_err *err) {
    tpl_seg *ns = realloc(p->segs, (size_t)(p->n + 1) * sizeof *ns);
    if (!ns) return squad_fail(err, SQUAD_E_NOMEM, "out of memory (template)");
    p->segs = ns;
    tpl_seg *s = &p->segs[p->n];
    s->ph = ph;
    s->lit = NULL;
    s->len = len;
    if (ph == PH_NONE) {
        s->lit = squad_malloc(len + 1, err);
        if (!s->lit) return SQUAD_E_NOMEM;
        memcpy(s->lit, lit, len);
        s->lit[len] = 0;
    }
    p->n++;
    return 0;
}

/* Which placeholder "{name}" starts at s (len bytes left); its length in *k. PH_NONE when none. */
static int placeholder_at(const char *s, size_t len, size_t *k) {
    for (int ph = 0; ph < PH_COUNT; ph++) {
        size_t n = strlen(PH_NAMES[ph]);
        if (len >= n + 2 && s[0] == '{' && !memcmp(s + 1, PH_NAMES[ph], n) && s[n + 1] == '}') {
            *k = n + 2;
            return ph;
        }
    }
    return PH_NONE;
}

/* Parses a template string of part `which`: literal text, {placeholder}s, {{ and }} for braces. */
static int part_parse(tpl_part *p, int which, const char *s, squad_err *err) {
    size_t len = strlen(s), i = 0;
    int count[PH_COUNT] = {0};
    char *lit = squad_malloc(len + 1, err); /* the literal being collected, braces unescaped */
    if (!lit) return SQUAD_E_NOMEM;
    size_t ln = 0;
    int rc = 0;
    while (i < len && rc == 0) {
        size_t k;
        if ((s[i] == '{' || s[i] == '}') && i + 1 < len && s[i + 1] == s[i]) {
            lit[ln++] = s[i];
            i += 2;
            continue;
        }
        if (s[i] != '{') {
            lit[ln++] = s[i++];
            continue;
        }
        int ph = placeholder_at(s + i, len - i, &k);
        if (ph == PH_NONE || !(PART_ALLOWED[which] & (1u << ph))) {
            const char *end = memchr(s + i, '}', len - i);
            int shown = end ? (int)(end - (s + i)) + 1 : (int)(len - i > 20 ? 20 : len - i);
            char allowed[64] = "";
            for (int q = 0; q < PH_COUNT; q++)
                if (PART_ALLOWED[which] & (1u << q)) {
                    strcat(allowed, allowed[0] ? ", {" : "{");
                    strcat(allowed, PH_NAMES[q]);
                    strcat(allowed, "}");
                }
            rc = squad_fail(err, SQUAD_E_INVALID, "template \"%s\": %.*s is not a placeholder it may use (%s; write {{ for a literal brace)",
                            PART_NAMES[which], shown > 40 ? 40 : shown, s + i, allowed[0] ? allowed : "none");
            break;
        }
        if (ln && (rc = part_push(p, PH_NONE, lit, ln, err)) < 0) break;
        ln = 0;
        if ((rc = part_push(p, ph, NULL, 0, err)) < 0) break;
        count[ph]++;
        i += k;
    }
    if (rc == 0 && ln) rc = part_push(p, PH_NONE, lit, ln, err);
    free(lit);
    if (rc < 0) return rc;
    int optional = which == PART_SYSTEM && len == 0; /* an empty system part: requests may not give one */
    for (int ph = 0; ph < PH_COUNT && !optional; ph++) {
        if ((PART_REQUIRED[which] & (1u << ph)) && count[ph] != 1)
            return squad_fail(err, SQUAD_E_INVALID, "template \"%s\" must contain {%s} exactly once",
                              PART_NAMES[which], PH_NAMES[ph]);
    }
    return 0;
}

static void set_default_letters(squad_template *t) {
    t->n_letters = SQUAD_MAX_LETTERS;
    for (int i = 0; i < SQUAD_MAX_LETTERS; i++) {
        snprintf(t->labels[i], SQUAD_LABEL_MAX, "%c", 'A' + i);
        snprintf(t->letters[i], LETTER_MAX, " %c", 'A' + i);
    }
}

squad_template *squad_template_default(squad_err *err) {
    squad_template *t = squad_calloc(1, sizeof *t, err);
    if (!t) return NULL;
    for (int i = 0; i < N_PARTS; i++)
        if (part_parse(&t->parts[i], i, DEFAULT_PARTS[i], err) < 0) {
            squad_template_free(t);
            return NULL;
        }
    set_default_letters(t);
    t->questions_per_row = DEFAULT_QUESTIONS_PER_ROW;
    return t;
}

void squad_template_free(squad_template *t) {
    if (!t) return;
    for (int i = 0; i < N_PARTS; i++) part_free(&t->parts[i]);
    free(t);
}

/* Reads a JSON array of 1..26 non-empty strings, each shorter than max bytes. */
static int string_list(json_t *v, const char *name, char out[][LETTER_MAX], size_t max, int *n, squad_err *err) {
    if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > SQUAD_MAX_LETTERS)
        return squad_fail(err, SQUAD_E_INVALID, "template \"%s\" must be an array of 1 to %d strings", name,
                          SQUAD_MAX_LETTERS);
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *s = json_array_get(v, i);
        if (!json_is_string(s) || json_string_length(s) == 0 || json_string_length(s) >= max)
            return squad_fail(err, SQUAD_E_INVALID, "template \"%s\"[%zu] must be a non-empty string of at most %zu bytes",
                              name, i, max - 1);
        memcpy(out[i], json_string_value(s), json_string_length(s) + 1);
    }
    *n = (int)json_array_size(v);
    return 0;
}

/* Applies the fields of a template file over the default's. */
static int template_override(squad_template *t, json_t *root, squad_err *err) {
    if (!json_is_object(root)) return squad_fail(err, SQUAD_E_INVALID, "a template must be a JSON object");
    char labels[SQUAD_MAX_LETTERS][LETTER_MAX], letters[SQUAD_MAX_LETTERS][LETTER_MAX];
    int n_labels = 0, n_letters = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (key[0] == '_') continue; /* "_comment" and the like */
        int part = -1;
        for (int i = 0; i < N_PARTS; i++)
            if (!strcmp(key, PART_NAMES[i])) part = i;
        if (part >= 0) {
            if (!json_is_string(v)) return squad_fail(err, SQUAD_E_INVALID, "template \"%s\" must be a string", key);
            if (memchr(json_string_value(v), 0, json_string_length(v)))
                return squad_fail(err, SQUAD_E_INVALID, "template \"%s\" contains a NUL character", key);
            part_free(&t->parts[part]);
            if (part_parse(&t->parts[part], part, json_string_value(v), err) < 0) return err ? err->code : SQUAD_E_INVALID;
        } else if (!strcmp(key, "labels")) {
            if (string_list(v, key, labels, SQUAD_LABEL_MAX, &n_labels, err) < 0) return SQUAD_E_INVALID;
        } else if (!strcmp(key, "letters")) {
            if (string_list(v, key, letters, LETTER_MAX, &n_letters, err) < 0) return SQUAD_E_INVALID;
        } else if (!strcmp(key, "questions_per_row")) {
            if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > SQUAD_MAX_SLOTS_PER_ROW)
                return squad_fail(err, SQUAD_E_INVALID, "template \"questions_per_row\" must be an integer from 1 to %d",
                                  SQUAD_MAX_SLOTS_PER_ROW);
            t->questions_per_row = (int)json_integer_value(v);
        } else {
            return squad_fail(err, SQUAD_E_INVALID,
                              "template: unknown field \"%s\" (known: system, prefix, question, option, cue, separator, "
                              "image, labels, letters, questions_per_row)",
                              key);
        }
    }
    if (n_labels && n_letters && n_labels != n_letters)
        return squad_fail(err, SQUAD_E_INVALID, "template has %d labels but %d letters", n_labels, n_letters);
    if (n_labels || n_letters) t->n_letters = n_labels ? n_labels : n_letters;
    for (int i = 0; i < t->n_letters && (n_labels || n_letters); i++) {
        if (n_labels) memcpy(t->labels[i], labels[i], SQUAD_LABEL_MAX);
        if (n_letters) memcpy(t->letters[i], letters[i], LETTER_MAX);
        if (!n_letters) { /* " " + label: the default cue ends before a space */
            t->letters[i][0] = ' ';
            memcpy(t->letters[i] + 1, labels[i], strlen(labels[i]) + 1); /* labels are < SQUAD_LABEL_MAX bytes */
        }
        if (!n_labels) {                                                       /* the letter without its spaces */
            const char *s = letters[i];
            while (*s == ' ') s++;
            if (!*s || strlen(s) >= SQUAD_LABEL_MAX)
                return squad_fail(err, SQUAD_E_INVALID, "template letter \"%s\" needs a label (give \"labels\")",
                                  letters[i]);
            memcpy(t->labels[i], s, strlen(s) + 1);
        }
    }
    return 0;
}

squad_template *squad_template_parse(const char *json, size_t len, squad_err *err) {
    json_error_t jerr;
    json_t *root = json_loadb(json, len, 0, &jerr);
    if (!root) {
        squad_fail(err, SQUAD_E_INVALID, "template is not valid JSON (line %d): %s", jerr.line, jerr.text);
        return NULL;
    }
    squad_template *t = squad_template_default(err);
    if (t && template_override(t, root, err) < 0) {
        squad_template_free(t);
        t = NULL;
    }
    json_decref(root);
    return t;
}

squad_template *squad_template_load_file(const char *path, squad_err *err) {
    size_t len;
    char *buf = squad_read_file(path, &len, err);
    if (!buf) return NULL;
    squad_template *t = squad_template_parse(buf, len, err);
    free(buf);
    if (!t) squad_fail_context(err, "%s: ", path);
    return t;
}

squad_template *squad_template_load_dir(const char *model_dir, squad_err *err) {
    char *path = squad_path_join(model_dir, SQUAD_TEMPLATE_FILE, err);
    if (!path) return NULL;
    struct stat st;
    squad_template *t;
    if (stat(path, &st) != 0 && errno == ENOENT) t = squad_template_default(err);
    else t = squad_template_load_file(path, err);
    free(path);
    return t;
}

/* ---------------------------------------------------------------------------------------------
 * Rendering
 * ------------------------------------------------------------------------------------------- */

/* The values a part's placeholders take (NULL where unused). */
typedef struct tpl_values {
    const char *v[PH_COUNT];
    size_t len[PH_COUNT];
} tpl_values;

static int render(token_builder *b, const tpl_part *p, const tpl_values *vals, squad_err *err) {
    for (int i = 0; i < p->n; i++) {
        const tpl_seg *s = &p->segs[i];
        int rc;
        if (s->ph == PH_NONE) rc = token_builder_template(b, s->lit, s->len, err);
        else if (s->ph == PH_LABEL) rc = token_builder_template(b, vals->v[PH_LABEL], vals->len[PH_LABEL], err);
        else rc = token_builder_text(b, vals->v[s->ph], vals->len[s->ph], err); /* request text: always plain */
        if (rc < 0) return rc;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Requests
 * ------------------------------------------------------------------------------------------- */

int squad_template_letters(const squad_template *tpl, squad_tokenizer *tok, int32_t *letters, squad_err *err) {
    for (int i = 0; i < tpl->n_letters; i++) {
        squad_idvec v = {0};
        if (squad_tokenize_append(tok, tpl->letters[i], strlen(tpl->letters[i]), SQUAD_TOK_PLAIN, &v, err) < 0)
            return squad_fail_context(err, "template letter \"%s\": ", tpl->letters[i]);
        size_t n = v.n;
        letters[i] = n ? v.v[0] : -1;
        squad_idvec_free(&v);
        if (n != 1)
            return squad_fail(err, SQUAD_E_MODEL,
                              "template letter \"%s\" is %zu tokens with this tokenizer; each letter must be a single token",
                              tpl->letters[i], n);
        for (int j = 0; j < i; j++)
            if (letters[j] == letters[i])
                return squad_fail(err, SQUAD_E_MODEL, "template letters \"%s\" and \"%s\" are the same token",
                                  tpl->letters[j], tpl->letters[i]);
    }
    return tpl->n_letters;
}

/* A required, non-empty string field of obj. */
static int need_string(json_t *obj, const char *key, const char *where, json_t **out, squad_err *err) {
    json_t *v = json_object_get(obj, key);
    if (!v) return squad_fail(err, SQUAD_E_INVALID, "%s.%s is missing", where, key);
    if (!json_is_string(v)) return squad_fail(err, SQUAD_E_INVALID, "%s.%s must be a string", where, key);
    if (json_string_length(v) == 0) return squad_fail(err, SQUAD_E_INVALID, "%s.%s is empty", where, key);
    *out = v;
    return 0;
}

/* request.images: absent, null, or 1..SQUAD_MAX_IMAGES_PER_ROW non-empty strings; the count in *n. */
static int check_images(json_t *req, int *n, squad_err *err) {
    json_t *imgs = json_object_get(req, "images");
    *n = 0;
    if (!imgs || json_is_null(imgs)) return 0;
    if (!json_is_array(imgs)) return squad_fail(err, SQUAD_E_INVALID, "request.images must be an array of strings");
    if (json_array_size(imgs) > SQUAD_MAX_IMAGES_PER_ROW)
        return squad_fail(err, SQUAD_E_INVALID, "request.images has %zu entries; at most %d are allowed",
                          json_array_size(imgs), SQUAD_MAX_IMAGES_PER_ROW);
    for (size_t i = 0; i < json_array_size(imgs); i++) {
        json_t *v = json_array_get(imgs, i);
        if (!json_is_string(v))
            return squad_fail(err, SQUAD_E_INVALID, "request.images[%zu] must be a string (a file or a data: URL)", i);
        if (json_string_length(v) == 0) return squad_fail(err, SQUAD_E_INVALID, "request.images[%zu] is empty", i);
    }
    *n = (int)json_array_size(imgs);
    return 0;
}

/* Checks the request's shape; every message names the field. */
static int check_request(const squad_template *tpl, json_t *req, squad_err *err) {
    if (!json_is_object(req)) return squad_fail(err, SQUAD_E_INVALID, "the request must be a JSON object");
    int n_images;
    if (check_images(req, &n_images, err) < 0) return SQUAD_E_INVALID;
    json_t *s, *sys = json_object_get(req, "system");
    s = json_object_get(req, "state");
    if (n_images && json_is_string(s) && json_string_length(s) == 0) {
        /* a screenshot alone is a state */
    } else if (need_string(req, "state", "request", &s, err) < 0) {
        return SQUAD_E_INVALID;
    }
    if (sys && !json_is_null(sys)) {
        if (!json_is_string(sys)) return squad_fail(err, SQUAD_E_INVALID, "request.system must be a string");
        if (tpl->parts[PART_SYSTEM].n == 0 && json_string_length(sys))
            return squad_fail(err, SQUAD_E_INVALID, "request.system is given but the template has no system part");
    }
    json_t *qs = json_object_get(req, "questions");
    if (!qs) return squad_fail(err, SQUAD_E_INVALID, "request.questions is missing");
    if (!json_is_array(qs)) return squad_fail(err, SQUAD_E_INVALID, "request.questions must be an array");
    if (json_array_size(qs) == 0) return squad_fail(err, SQUAD_E_INVALID, "request.questions is empty");
    if (json_array_size(qs) > INT32_MAX / 2) return squad_fail(err, SQUAD_E_INVALID, "request.questions is too long");
    for (size_t i = 0; i < json_array_size(qs); i++) {
        json_t *q = json_array_get(qs, i), *t;
        char where[48];
        snprintf(where, sizeof where, "request.questions[%zu]", i);
        if (!json_is_object(q)) return squad_fail(err, SQUAD_E_INVALID, "%s must be an object", where);
        if (need_string(q, "text", where, &t, err) < 0) return SQUAD_E_INVALID;
        json_t *opts = json_object_get(q, "options");
        if (!opts) return squad_fail(err, SQUAD_E_INVALID, "%s.options is missing", where);
        if (!json_is_array(opts)) return squad_fail(err, SQUAD_E_INVALID, "%s.options must be an array", where);
        size_t no = json_array_size(opts);
        if (no == 0) return squad_fail(err, SQUAD_E_INVALID, "%s.options is empty", where);
        if (no > (size_t)tpl->n_letters)
            return squad_fail(err, SQUAD_E_INVALID, "%s has %zu options; at most %d are allowed (the template's letters)",
                              where, no, tpl->n_letters);
        for (size_t j = 0; j < no; j++)
            if (!json_is_string(json_array_get(opts, j)))
                return squad_fail(err, SQUAD_E_INVALID, "%s.options[%zu] must be a string", where, j);
    }
    return 0;
}

void squad_text_rows_free(squad_text_rows *r) {
    for (int i = 0; i < r->n_images; i++)
        if (r->image_loader.release) r->image_loader.release(r->image_loader.ctx, &r->images[i]);
    free(r->images);
    for (int i = 0; i < r->n_rows; i++) {
        if (r->row_ids) free(r->row_ids[i]);
        if (r->row_slots) free(r->row_slots[i]);
        if (r->row_nopts) free(r->row_nopts[i]);
    }
    free(r->row_ids);
    free(r->row_slots);
    free(r->row_nopts);
    free(r->rows);
    free(r->q_row);
    free(r->q_slot);
    memset(r, 0, sizeof *r);
}

/* One image through the image part: its literal text as template text, {image} as the image's run
 * of `tokens` pad ids, whose first index becomes the image's pos. */
static int render_image(const squad_template *tpl, token_builder *b, squad_row_image *img, int32_t pad,
                        squad_err *err) {
    const tpl_part *p = &tpl->parts[PART_IMAGE];
    for (int i = 0; i < p->n; i++) {
        const tpl_seg *s = &p->segs[i];
        int rc;
        if (s->ph == PH_NONE) {
            rc = token_builder_template(b, s->lit, s->len, err);
        } else { /* PH_IMAGE: the text before it is encoded first, so the run starts at a known index */
            rc = token_builder_flush(b, err);
            if (rc >= 0 && b->ids.n > INT32_MAX - (size_t)img->tokens)
                rc = squad_fail(err, SQUAD_E_INVALID, "the request is too long");
            img->pos = (int)b->ids.n;
            for (int k = 0; rc >= 0 && k < img->tokens; k++) rc = squad_idvec_push(&b->ids, pad, err);
        }
        if (rc < 0) return rc;
    }
    return 0;
}

/* The prefix: the system part (when the request gives one) and the prefix part, whose {state} is
 * the request's images, each through the image part, then the state's text. */
static int build_prefix(const squad_template *tpl, token_builder *b, json_t *req, squad_text_rows *out,
                        int32_t pad, squad_err *err) {
    tpl_values vals = {{0}, {0}};
    json_t *sys = json_object_get(req, "system"), *state = json_object_get(req, "state");
    int rc;
    if (json_is_string(sys) && json_string_length(sys)) {
        vals.v[PH_SYSTEM] = json_string_value(sys);
        vals.len[PH_SYSTEM] = json_string_length(sys);
        if ((rc = render(b, &tpl->parts[PART_SYSTEM], &vals, err)) < 0) return rc;
    }
    const tpl_part *p = &tpl->parts[PART_PREFIX];
    for (int i = 0; i < p->n; i++) {
        const tpl_seg *s = &p->segs[i];
        if (s->ph == PH_NONE) {
            rc = token_builder_template(b, s->lit, s->len, err);
        } else { /* PH_STATE, the prefix part's one placeholder */
            rc = 0;
            for (int k = 0; k < out->n_images && rc >= 0; k++) rc = render_image(tpl, b, &out->images[k], pad, err);
            if (rc >= 0) rc = token_builder_text(b, json_string_value(state), json_string_length(state), err);
        }
        if (rc < 0) return rc;
    }
    return token_builder_flush(b, err);
}

/* One question: text, lettered options, cue. The slot is the cue's last token. */
static int build_question(const squad_template *tpl, token_builder *b, json_t *q, int32_t *slot, squad_err *err) {
    tpl_values vals = {{0}, {0}};
    json_t *text = json_object_get(q, "text"), *opts = json_object_get(q, "options");
    vals.v[PH_QUESTION] = json_string_value(text);
    vals.len[PH_QUESTION] = json_string_length(text);
    int rc = render(b, &tpl->parts[PART_QUESTION], &vals, err);
    for (size_t j = 0; rc >= 0 && j < json_array_size(opts); j++) {
        json_t *o = json_array_get(opts, j);
        vals.v[PH_LABEL] = tpl->labels[j];
        vals.len[PH_LABEL] = strlen(tpl->labels[j]);
        vals.v[PH_OPTION] = json_string_value(o);
        vals.len[PH_OPTION] = json_string_length(o);
        rc = render(b, &tpl->parts[PART_OPTION], &vals, err);
    }
    if (rc >= 0) rc = render(b, &tpl->parts[PART_CUE], &vals, err);
    if (rc >= 0) rc = token_builder_flush(b, err);
    if (rc < 0) return rc;
    if (b->ids.n > INT32_MAX) return squad_fail(err, SQUAD_E_INVALID, "the request is too long");
    *slot = (int32_t)b->ids.n - 1;
    return 0;
}

static int build_rows(const squad_template *tpl, squad_tokenizer *tok, json_t *req, int max_tokens,
                      squad_text_rows *out, squad_err *err) {
    token_builder b = {tok, {0}, {0}};
    int32_t pad = out->n_images ? squad_tokenizer_token_id(tok, SQUAD_IMAGE_PAD_TOKEN) : -1;
    int rc = build_prefix(tpl, &b, req, out, pad, err);
    size_t state_len = b.ids.n;
    if (rc < 0) goto done;
    if (max_tokens > 0 && state_len >= (size_t)max_tokens) {
        rc = squad_fail(err, SQUAD_E_INVALID, "the state is %zu tokens" SQUAD_ROW_TOO_LONG "%d tokens",
                        state_len, max_tokens);
        goto done;
    }
    json_t *qs = json_object_get(req, "questions");
    int nq = (int)json_array_size(qs), per = tpl->questions_per_row;
    int nr = (nq + per - 1) / per;
    out->state_len = (int)state_len;
    out->n_questions = nq;
    out->rows = squad_calloc((size_t)nr, sizeof(squad_row), err);
    out->row_ids = squad_calloc((size_t)nr, sizeof(int32_t *), err);
    out->row_slots = squad_calloc((size_t)nr, sizeof(int32_t *), err);
    out->row_nopts = squad_calloc((size_t)nr, sizeof(int32_t *), err);
    out->q_row = squad_calloc((size_t)nq, sizeof(int), err);
    out->q_slot = squad_calloc((size_t)nq, sizeof(int), err);
    if (!out->rows || !out->row_ids || !out->row_slots || !out->row_nopts || !out->q_row || !out->q_slot) {
        rc = SQUAD_E_NOMEM;
        goto done;
    }
    size_t total = 0;
    for (int r = 0; r < nr; r++) {
        int q0 = r * per, qn = nq - q0 < per ? nq - q0 : per;
        out->n_rows = r + 1;
        out->row_slots[r] = squad_calloc((size_t)qn, sizeof(int32_t), err);
        out->row_nopts[r] = squad_calloc((size_t)qn, sizeof(int32_t), err);
        if (!out->row_slots[r] || !out->row_nopts[r]) {
            rc = SQUAD_E_NOMEM;
            goto done;
        }
        b.ids.n = state_len; /* every row starts with the prefix */
        for (int k = 0; k < qn; k++) {
            json_t *q = json_array_get(qs, (size_t)(q0 + k));
            tpl_values none = {{0}, {0}};
            if (k > 0 && (rc = render(&b, &tpl->parts[PART_SEPARATOR], &none, err)) < 0) goto done;
            if ((rc = build_question(tpl, &b, q, &out->row_slots[r][k], err)) < 0) goto done;
            out->row_nopts[r][k] = (int32_t)json_array_size(json_object_get(q, "options"));
            out->q_row[q0 + k] = r;
            out->q_slot[q0 + k] = k;
        }
        if (max_tokens > 0 && b.ids.n > (size_t)max_tokens) {
            rc = squad_fail(err, SQUAD_E_INVALID,
                            "request.questions[%d] makes a row of %zu tokens" SQUAD_ROW_TOO_LONG "%d tokens", q0,
                            b.ids.n, max_tokens);
            goto done;
        }
        total += b.ids.n;
        if (total > MAX_TOTAL_IDS) {
            rc = squad_fail(err, SQUAD_E_INVALID,
                            "the request is too large: its %d rows would hold more than %zu tokens (each row repeats "
                            "the %zu-token state); send fewer questions per request",
                            nr, MAX_TOTAL_IDS, state_len);
            goto done;
        }
        out->row_ids[r] = squad_malloc(b.ids.n * sizeof(int32_t), err);
        if (!out->row_ids[r]) {
            rc = SQUAD_E_NOMEM;
            goto done;
        }
        memcpy(out->row_ids[r], b.ids.v, b.ids.n * sizeof(int32_t));
        squad_row *row = &out->rows[r];
        row->ids = out->row_ids[r];
        row->n_ids = (int)b.ids.n;
        row->slots = out->row_slots[r];
        row->nopts = out->row_nopts[r];
        row->n_slots = qn;
        row->letters = out->letters;
        row->n_letters = out->n_letters;
        row->state_len = (int)state_len;
        row->images = out->n_images ? out->images : NULL;
        row->n_images = out->n_images;
    }
    rc = 0;
done:
    token_builder_free(&b);
    return rc;
}

/* Loads request.images through the loader into out->images (out->n_images those loaded so far, so
 * that squad_text_rows_free releases them on any failure). */
static int load_images(squad_tokenizer *tok, json_t *req, const squad_image_loader *loader, squad_text_rows *out,
                       squad_err *err) {
    json_t *imgs = json_object_get(req, "images");
    size_t n = json_is_array(imgs) ? json_array_size(imgs) : 0;
    if (n == 0) return 0;
    if (!loader || !loader->load)
        return squad_fail(err, SQUAD_E_INVALID, "request.images: images are not taken here");
    if (squad_tokenizer_token_id(tok, SQUAD_IMAGE_PAD_TOKEN) < 0)
        return squad_fail(err, SQUAD_E_INVALID,
                          "request.images: the tokenizer has no " SQUAD_IMAGE_PAD_TOKEN " token: this model takes no images");
    out->image_loader = *loader;
    out->images = squad_calloc(n, sizeof *out->images, err);
    if (!out->images) return SQUAD_E_NOMEM;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(imgs, i);
        int rc = loader->load(loader->ctx, json_string_value(v), json_string_length(v), &out->images[i], err);
        if (rc < 0) return squad_fail_context(err, "request.images[%zu]: ", i);
        out->n_images = (int)i + 1;
        if (out->images[i].tokens < 1)
            return squad_fail(err, SQUAD_E_INVALID, "request.images[%zu]: the image has no tokens", i);
    }
    return 0;
}

int squad_template_build(const squad_template *tpl, squad_tokenizer *tok, const char *request, size_t len,
                         int max_tokens, squad_text_rows *out, squad_err *err) {
    return squad_template_build_images(tpl, tok, request, len, max_tokens, NULL, out, err);
}

int squad_template_build_images(const squad_template *tpl, squad_tokenizer *tok, const char *request, size_t len,
                                int max_tokens, const squad_image_loader *images, squad_text_rows *out,
                                squad_err *err) {
    memset(out, 0, sizeof *out);
    json_error_t jerr;
    json_t *req = json_loadb(request, len, 0, &jerr);
    if (!req) return squad_fail(err, SQUAD_E_INVALID, "the request is not valid JSON (line %d): %s", jerr.line, jerr.text);
    int rc = check_request(tpl, req, err);
    if (rc >= 0) rc = load_images(tok, req, images, out, err);
    if (rc >= 0) {
        rc = squad_template_letters(tpl, tok, out->letters, err);
        if (rc >= 0) {
            out->n_letters = rc;
            for (int i = 0; i < tpl->n_letters; i++) memcpy(out->labels[i], tpl->labels[i], SQUAD_LABEL_MAX);
            rc = build_rows(tpl, tok, req, max_tokens, out, err);
        }
    }
    json_decref(req);
    if (rc < 0) squad_text_rows_free(out);
    return rc < 0 ? rc : 0;
}
