/*
 * fuzz_template.c — libFuzzer target: arbitrary bytes as a text request for the prompt template.
 *
 * The default template and the Qwen3 tokenizer ($SQUAD_FUZZ_TOKENIZER, else
 * third_party/qwen3/tokenizer.json from the working directory or this file's repository) turn the
 * input into rows, or refuse it with a message. Rows must satisfy what the engine relies on: slots
 * sorted inside the row and at or after the state, nopts in 1..letters, the same prefix in every row.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_tokenizer_path.h"
#include "template.h"
#include "tokenizer.h"

static squad_tokenizer *tok;      /* the harness's own state, loaded once */
static squad_template *tpl;

static void load_once(void) {
    if (tok) return;
    squad_err err = {0};
    tok = fuzz_load_tokenizer(&err);
    tpl = squad_template_default(&err);
    if (!tok || !tpl) {
        fprintf(stderr, "fuzz_template: %s (set SQUAD_FUZZ_TOKENIZER)\n", err.msg);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    load_once();
    squad_err err;
    err.msg[0] = 0;
    squad_text_rows rows;
    int max_tokens = size % 2 ? 4096 : 0; /* with and without a model limit */
    if (squad_template_build(tpl, tok, (const char *)data, size, max_tokens, &rows, &err) != 0) {
        if (!err.msg[0] || rows.rows || rows.n_rows) __builtin_trap();
        return 0;
    }
    if (rows.n_rows < 1 || rows.n_questions < 1 || rows.state_len < 1) __builtin_trap();
    for (int r = 0; r < rows.n_rows; r++) {
        const squad_row *row = &rows.rows[r];
        if (row->state_len != rows.state_len || row->n_ids <= row->state_len) __builtin_trap();
        if (max_tokens && row->n_ids > max_tokens) __builtin_trap();
        if (memcmp(row->ids, rows.rows[0].ids, (size_t)rows.state_len * sizeof(int32_t))) __builtin_trap();
        for (int k = 0; k < row->n_slots; k++) {
            if (row->slots[k] < row->state_len || row->slots[k] >= row->n_ids) __builtin_trap();
            if (k && row->slots[k] <= row->slots[k - 1]) __builtin_trap();
            if (row->nopts[k] < 1 || row->nopts[k] > row->n_letters) __builtin_trap();
        }
        for (int i = 0; i < row->n_ids; i++)
            if (row->ids[i] < 0 || row->ids[i] >= squad_tokenizer_vocab_size(tok)) __builtin_trap();
    }
    for (int q = 0; q < rows.n_questions; q++)
        if (rows.q_row[q] < 0 || rows.q_row[q] >= rows.n_rows || rows.q_slot[q] >= rows.rows[rows.q_row[q]].n_slots)
            __builtin_trap();
    squad_text_rows_free(&rows);
    return 0;
}
