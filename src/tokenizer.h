/*
 * tokenizer.h — text <-> token ids with a Hugging Face tokenizer.json of the byte-level BPE family
 * (GPT-2, Llama 3, Qwen 2/3/3.5 ...), read as it is rather than hard-coded for one model.
 *
 * The pipeline is the one Hugging Face `tokenizers` runs for encode(text, add_special_tokens=false):
 *   1. added tokens whose "normalized" flag is false are split out of the raw text (longest match
 *      at the leftmost position, with their lstrip / rstrip / single_word flags);
 *   2. each remaining piece is normalised on its own (NFC / NFD / NFKC / NFKD, a Sequence, or none)
 *      and added tokens with "normalized": true are split out of the normalised text;
 *   3. the pre-tokenizer (Split with the file's own regex, run by PCRE2 with UTF + UCP and JIT, and
 *      ByteLevel with or without its GPT-2 regex) cuts pieces into words;
 *   4. each word goes through BPE (merge ranks from the file, a heap over candidate pairs, a bounded
 *      cache of recent words).
 * Anything the file asks for that squad does not implement is refused at load time with a message
 * naming it; the post-processor, truncation and padding do not affect encode without special tokens
 * and are ignored.
 *
 * A tokenizer object is immutable after loading except for its word cache and regex scratch, which
 * a lock inside the object guards: several threads may encode with one tokenizer (they take turns
 * in the encoder; an attached text cache answers repeated texts without the lock). Nothing is
 * global.
 */
#ifndef SQUAD_TOKENIZER_H
#define SQUAD_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "squad.h"
/* The UTF-8 helpers (utf8.h), for the modules that reach squad_utf8_invalid_offset through this
 * header; code that needs them includes utf8.h itself. */
#include "utf8.h"

typedef struct squad_tokenizer squad_tokenizer;

/* A growable array of token ids. Zero-initialise; free with squad_idvec_free. */
typedef struct squad_idvec {
    int32_t *v;
    size_t n, cap;
} squad_idvec;

int squad_idvec_push(squad_idvec *vec, int32_t id, squad_err *err);
int squad_idvec_append(squad_idvec *vec, const int32_t *ids, size_t n, squad_err *err);
void squad_idvec_free(squad_idvec *vec);

/* Loads a tokenizer.json file, or the same JSON from a buffer (len bytes, need not end in NUL). */
squad_tokenizer *squad_tokenizer_load(const char *path, squad_err *err);
squad_tokenizer *squad_tokenizer_load_buffer(const char *json, size_t len, squad_err *err);
void squad_tokenizer_free(squad_tokenizer *tok);

/* Load flags: SQUAD_TOK_LOAD_GENERIC parses the whole file with jansson instead of reading the
 * vocabulary and merges straight from the text (the same result, slower; for tests and fuzzing). */
enum { SQUAD_TOK_LOAD_GENERIC = 1u };
squad_tokenizer *squad_tokenizer_load_buffer_ex(const char *json, size_t len, unsigned flags, squad_err *err);

/* Flags of squad_tokenize_append. */
enum {
    /* Added tokens in the text are ordinary text: "<|im_end|>" inside a web page stays text. */
    SQUAD_TOK_PLAIN = 1u
};

/* Encodes text (len bytes of UTF-8) as encode(text, add_special_tokens=false) does, appending the ids
 * to out. Invalid UTF-8 is SQUAD_E_INVALID with the byte offset of the first bad sequence. On any
 * failure out is left as it was. */
int squad_tokenize_append(squad_tokenizer *tok, const char *text, size_t len, unsigned flags, squad_idvec *out,
                          squad_err *err);

/* An optional cache of whole texts' ids that squad_tokenize_append consults for texts of at least
 * min_bytes (a page asked about again is not encoded again). get appends the ids of (flags, text)
 * to out and returns 1 on a hit, 0 on a miss, < 0 on an error (err filled); put offers the ids of
 * a text just encoded. Both are called from any thread that encodes, outside the tokenizer's lock:
 * the cache does its own locking. */
typedef struct squad_tok_text_cache {
    size_t min_bytes;
    int (*get)(void *ctx, unsigned flags, const char *text, size_t len, squad_idvec *out, squad_err *err);
    void (*put)(void *ctx, unsigned flags, const char *text, size_t len, const int32_t *ids, size_t n);
    void *ctx;
} squad_tok_text_cache;

/* Attaches a text cache (copied; NULL detaches). Call before other threads encode. */
void squad_tokenizer_set_text_cache(squad_tokenizer *tok, const squad_tok_text_cache *cache);

/* The same, into a new array (*ids, free()); *n its length. */
int squad_tokenize(squad_tokenizer *tok, const char *text, size_t len, int32_t **ids, int *n, squad_err *err);

/* Decodes ids through the file's decoder (ByteLevel: bytes joined, invalid UTF-8 replaced by U+FFFD as
 * Hugging Face does). skip_special drops special added tokens. *text is NUL-terminated (free());
 * *len excludes the NUL. An id that names no token is SQUAD_E_INVALID. */
int squad_detokenize(const squad_tokenizer *tok, const int32_t *ids, size_t n, int skip_special, char **text,
                     size_t *len, squad_err *err);

/* The id of a token given as the file writes it (an added token's content, or a vocabulary key such
 * as "Ġthe"); -1 when there is none. */
int32_t squad_tokenizer_token_id(const squad_tokenizer *tok, const char *token);

/* Finds the leftmost (then longest) added token in s, matched as the file spells it and ignoring its
 * strip flags (for trusted template text): 1 with its span [*start, *end) and id, 0 when none. */
int squad_tokenizer_find_added(const squad_tokenizer *tok, const char *s, size_t len, size_t *start, size_t *end,
                               int32_t *id);

/* One more than the largest token id (the embedding rows a model needs). */
int squad_tokenizer_vocab_size(const squad_tokenizer *tok);

#endif /* SQUAD_TOKENIZER_H */
