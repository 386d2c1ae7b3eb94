/*
 * token_builder.c — request text and template markup into token ids (token_builder.h): text
 * collects in a squad_buf and is encoded, added tokens disabled, at each added token and flush.
 */
#include "token_builder.h"

#include <string.h>

int token_builder_flush(token_builder *b, squad_err *err) {
    if (b->pending.oom) return squad_fail(err, SQUAD_E_NOMEM, "out of memory (request text)");
    if (!b->pending.n) return 0;
    int rc = squad_tokenize_append(b->tok, b->pending.s, b->pending.n, SQUAD_TOK_PLAIN, &b->ids, err);
    squad_buf_reset(&b->pending);
    return rc;
}

int token_builder_text(token_builder *b, const char *s, size_t n, squad_err *err) {
    if (squad_buf_put(&b->pending, s, n) < 0) return squad_fail(err, SQUAD_E_NOMEM, "out of memory (request text)");
    return 0;
}

int token_builder_template(token_builder *b, const char *s, size_t n, squad_err *err) {
    while (n) {
        size_t start, end;
        int32_t id;
        if (!squad_tokenizer_find_added(b->tok, s, n, &start, &end, &id)) return token_builder_text(b, s, n, err);
        int rc;
        if ((rc = token_builder_text(b, s, start, err)) < 0 || (rc = token_builder_flush(b, err)) < 0 ||
            (rc = squad_idvec_push(&b->ids, id, err)) < 0)
            return rc;
        s += end;
        n -= end;
    }
    return 0;
}

void token_builder_free(token_builder *b) {
    squad_idvec_free(&b->ids);
    squad_buf_free(&b->pending);
}
