/*
 * memo.c — the exact-request memo (memo.h), a byte-bounded LRU map (lru_map.h) from a row to its
 * answer.
 *
 * The key is the row's content: a header (n_ids, n_slots, n_letters, state_len, specialist), then
 * its ids, slots, nopts and letters, given to the map in pieces (never copied to look a row up) and
 * hashed with squad_hash_ints. A row with images adds a sixth piece, each image's position, token
 * count, grid and identity (the pixels' digest), so the same ids around another screenshot are
 * another request; a text-only row's key is the five pieces as before. A forced specialist is part of the key: the same tokens forced to
 * another route (or left to the router) are another request. The value is the answer: a header
 * (route, n_routes, whether the full-vocabulary figures follow), the probabilities of each slot's
 * options, the router's probabilities (with specialists), then, when the answer has them, the
 * full-vocabulary figures of each slot. The map counts every byte against the budget.
 */
#include "memo.h"

#include <stdlib.h>
#include <string.h>

#include "hash_index.h"
#include "lru_map.h"
#include "util.h"

#define MEMO_HASH_SEED 0x243f6a8885a308d3ull

/* A slot's full-vocabulary figures (squad_result's fields of the same names). */
typedef struct memo_vocab {
    float vocab_lse, letters_lse, top_logit, label_mass;
    int32_t top_token;
} memo_vocab;

/* The head of the key: the row's counts and the fields that are not arrays. */
typedef struct memo_key_head {
    int32_t n_ids, n_slots, n_letters, state_len, specialist;
} memo_key_head;

/* The head of the value. */
typedef struct memo_answer_head {
    int32_t route, n_routes, has_vocab;
} memo_answer_head;

/* The key's pieces: head, ids, slots, nopts, letters, and with images the images. */
#define MEMO_KEY_PIECES 6

/* One image of the key: where its run is, its size, and what it shows. */
typedef struct memo_key_image {
    int32_t pos, tokens, grid[3];
    uint8_t identity[16];
} memo_key_image;

/* The images' piece of a key (held by the caller for the call). */
typedef struct memo_key_images {
    memo_key_image im[SQUAD_MAX_IMAGES_PER_ROW];
} memo_key_images;

struct squad_memo {
    squad_lru_map *map;
};

static uint64_t row_key(const squad_row *r) {
    uint64_t h = MEMO_HASH_SEED;
    h = squad_hash_ints(h, r->ids, (size_t)r->n_ids);
    h = squad_hash_ints(h, r->slots, (size_t)r->n_slots);
    h = squad_hash_ints(h, r->nopts, (size_t)r->n_slots);
    h = squad_hash_ints(h, r->letters, (size_t)r->n_letters);
    h = squad_hash_mix(h ^ (uint64_t)(uint32_t)r->specialist);
    for (int k = 0; k < r->n_images && k < SQUAD_MAX_IMAGES_PER_ROW; k++)
        h = squad_hash_bytes(h ^ (uint64_t)(uint32_t)r->images[k].pos, r->images[k].identity,
                             sizeof r->images[k].identity);
    return squad_hash_mix(h ^ (uint64_t)(uint32_t)r->state_len);
}

/* The key's pieces of the row: 5, or 6 with images (their piece filled into *ims). */
static int key_pieces(const squad_row *r, memo_key_head *head, memo_key_images *ims, squad_bytes *key) {
    head->n_ids = r->n_ids;
    head->n_slots = r->n_slots;
    head->n_letters = r->n_letters;
    head->state_len = r->state_len;
    head->specialist = r->specialist;
    key[0] = (squad_bytes){head, sizeof *head};
    key[1] = (squad_bytes){r->ids, (size_t)r->n_ids * sizeof(int32_t)};
    key[2] = (squad_bytes){r->slots, (size_t)r->n_slots * sizeof(int32_t)};
    key[3] = (squad_bytes){r->nopts, (size_t)r->n_slots * sizeof(int32_t)};
    key[4] = (squad_bytes){r->letters, (size_t)r->n_letters * sizeof(int32_t)};
    const int n = r->n_images < SQUAD_MAX_IMAGES_PER_ROW ? r->n_images : SQUAD_MAX_IMAGES_PER_ROW;
    if (n <= 0) return MEMO_KEY_PIECES - 1;
    memset(ims, 0, sizeof(memo_key_image) * (size_t)n); /* no stack padding in the key */
    for (int k = 0; k < n; k++) {
        ims->im[k].pos = r->images[k].pos;
        ims->im[k].tokens = r->images[k].tokens;
        memcpy(ims->im[k].grid, r->images[k].grid, sizeof ims->im[k].grid);
        memcpy(ims->im[k].identity, r->images[k].identity, sizeof ims->im[k].identity);
    }
    key[5] = (squad_bytes){ims->im, sizeof(memo_key_image) * (size_t)n};
    return MEMO_KEY_PIECES;
}

squad_memo *squad_memo_new(size_t budget_bytes, squad_err *err) {
    squad_memo *m = squad_calloc(1, sizeof *m, err);
    if (!m) return NULL;
    m->map = squad_lru_map_new(budget_bytes, 0, err); /* the engine's: one thread */
    if (!m->map) {
        free(m);
        return NULL;
    }
    return m;
}

void squad_memo_free(squad_memo *m) {
    if (!m) return;
    squad_lru_map_free(m->map);
    free(m);
}

int squad_memo_get(squad_memo *m, const squad_row *r, squad_result *out) { return squad_memo_lookup(m, r, 0, out); }

typedef struct memo_hit {
    const squad_row *row; /* equal to the stored one: its nopts say how the probabilities are laid out */
    int need_vocab;
    squad_result *out;
} memo_hit;

/* The map's use of a hit: the stored answer into out, or 0 when it lacks the figures asked for. */
static int copy_answer(void *ctx, const void *val, size_t vlen) {
    const memo_hit *h = ctx;
    const unsigned char *v = val;
    memo_answer_head head;
    if (vlen < sizeof head) return -1;
    memcpy(&head, v, sizeof head);
    if (h->need_vocab && !head.has_vocab) return 0;
    const squad_row *r = h->row;
    squad_result *out = h->out;
    memset(out, 0, sizeof *out);
    out->n_slots = r->n_slots;
    out->route = head.route;
    out->n_routes = head.n_routes;
    v += sizeof head;
    for (int i = 0; i < r->n_slots; i++) {
        memcpy(out->probs[i], v, (size_t)r->nopts[i] * sizeof(float));
        v += (size_t)r->nopts[i] * sizeof(float);
    }
    if (head.n_routes) memcpy(out->route_probs, v, (size_t)head.n_routes * sizeof(float));
    v += (size_t)head.n_routes * sizeof(float);
    if (h->need_vocab) {
        out->has_vocab = 1;
        for (int i = 0; i < r->n_slots; i++, v += sizeof(memo_vocab)) {
            memo_vocab mv;
            memcpy(&mv, v, sizeof mv);
            out->vocab_lse[i] = mv.vocab_lse;
            out->letters_lse[i] = mv.letters_lse;
            out->top_logit[i] = mv.top_logit;
            out->top_token[i] = mv.top_token;
            out->label_mass[i] = mv.label_mass;
        }
    }
    return 1;
}

int squad_memo_lookup(squad_memo *m, const squad_row *r, int need_vocab, squad_result *out) {
    if (!m || !r) return 0;
    memo_key_head kh;
    memo_key_images ims;
    squad_bytes key[MEMO_KEY_PIECES];
    const int n_key = key_pieces(r, &kh, &ims, key);
    memo_hit h = {r, need_vocab, out};
    return squad_lru_map_get(m->map, row_key(r), key, n_key, copy_answer, &h) > 0;
}

int squad_memo_put(squad_memo *m, const squad_row *r, const squad_result *res, squad_err *err) {
    if (!m || !r || !res) return squad_fail(err, SQUAD_E_INVALID, "memo: nothing to store");
    if (r->n_slots > SQUAD_MAX_SLOTS_PER_ROW) return squad_fail(err, SQUAD_E_INVALID, "memo: too many slots");
    if (res->n_routes < 0 || res->n_routes > SQUAD_MAX_ROUTES) return squad_fail(err, SQUAD_E_INVALID, "memo: bad routes");
    for (int i = 0; i < r->n_slots; i++)
        if (r->nopts[i] < 0 || r->nopts[i] > SQUAD_MAX_LETTERS) return squad_fail(err, SQUAD_E_INVALID, "memo: bad nopts");
    memo_key_head kh;
    memo_key_images ims;
    squad_bytes key[MEMO_KEY_PIECES];
    const int n_key = key_pieces(r, &kh, &ims, key);
    /* the value's pieces: head, each slot's probabilities, the router's, the figures */
    const memo_answer_head head = {res->route, res->n_routes, res->has_vocab ? 1 : 0};
    memo_vocab vocab[SQUAD_MAX_SLOTS_PER_ROW];
    squad_bytes val[SQUAD_MAX_SLOTS_PER_ROW + 3];
    int n_val = 0;
    val[n_val++] = (squad_bytes){&head, sizeof head};
    for (int i = 0; i < r->n_slots; i++) val[n_val++] = (squad_bytes){res->probs[i], (size_t)r->nopts[i] * sizeof(float)};
    val[n_val++] = (squad_bytes){res->route_probs, (size_t)res->n_routes * sizeof(float)};
    if (head.has_vocab) {
        for (int i = 0; i < r->n_slots; i++) {
            memset(&vocab[i], 0, sizeof vocab[i]); /* no padding bytes of the stack in the entry */
            vocab[i].vocab_lse = res->vocab_lse[i];
            vocab[i].letters_lse = res->letters_lse[i];
            vocab[i].top_logit = res->top_logit[i];
            vocab[i].top_token = res->top_token[i];
            vocab[i].label_mass = res->label_mass[i];
        }
        val[n_val++] = (squad_bytes){vocab, (size_t)r->n_slots * sizeof *vocab};
    }
    return squad_lru_map_put(m->map, row_key(r), key, n_key, val, n_val, err);
}

void squad_memo_clear(squad_memo *m) {
    if (m) squad_lru_map_clear(m->map);
}

void squad_memo_get_stats(const squad_memo *m, squad_memo_stats *out) {
    memset(out, 0, sizeof *out);
    if (!m) return;
    squad_lru_map_stats st;
    squad_lru_map_get_stats(m->map, &st);
    out->hits = st.hits;
    out->misses = st.misses;
    out->stored = st.stored;
    out->evicted = st.evicted;
    out->entries = st.entries;
    out->bytes_held = st.bytes_held;
    out->budget_bytes = st.budget_bytes;
}
