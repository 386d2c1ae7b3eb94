/*
 * token_builder.h — turns a prompt made of two kinds of pieces into token ids: request text, which
 * is always plain (an "<|im_start|>" typed by a user stays text), and trusted template markup,
 * whose added tokens become their ids. The chat templates (template.c) and the decision APIs
 * (decisions.c) render their rows through it.
 *
 * Design: text pieces are not encoded one by one; they collect in a pending buffer that is encoded
 * in one piece, with added tokens disabled, when an added token, a flush or the end comes. So the
 * ids of "ab" do not depend on whether it arrived as "a" + "b", and a caller that flushes at the
 * end of a shared prefix gets the same prefix ids whatever follows.
 */
#ifndef SQUAD_TOKEN_BUILDER_H
#define SQUAD_TOKEN_BUILDER_H

#include <stddef.h>

#include "tokenizer.h"
#include "util.h"

/* Zero-initialise with the tokenizer ({tok} in an initialiser); free with token_builder_free.
 * ids may be read, and cut back (ids.n = k) after a flush, by the caller. */
typedef struct token_builder {
    squad_tokenizer *tok;
    squad_idvec ids;
    squad_buf pending; /* text not yet encoded */
} token_builder;

/* Request text: appended as plain text, never parsed for added tokens. */
int token_builder_text(token_builder *b, const char *s, size_t n, squad_err *err);
/* Trusted template text: its added tokens become their ids, the text between them is plain. */
int token_builder_template(token_builder *b, const char *s, size_t n, squad_err *err);
/* Encodes the pending text into ids. */
int token_builder_flush(token_builder *b, squad_err *err);
void token_builder_free(token_builder *b);

#endif /* SQUAD_TOKEN_BUILDER_H */
