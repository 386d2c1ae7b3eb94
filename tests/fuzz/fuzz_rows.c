/*
 * fuzz_rows.c — libFuzzer target: arbitrary bytes as a row's JSON line (rows.c), then the row checks
 * (engine.c's squad_row_check) against a small model configuration. Neither may crash, and an
 * accepted row must satisfy every invariant the engine relies on.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "rows.h"
#include "squad.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static squad_model model; /* a configuration only: row checks read the vocabulary and the length limit */
    model.cfg.vocab_size = 300;
    model.cfg.max_position = 4096;
    squad_row_buf rb;
    squad_err err = {0};
    const int32_t default_letters[3] = {1, 2, 3};
    if (squad_row_parse_json(&rb, (const char *)data, size, (size & 1) ? default_letters : NULL, 3, &err) == 0) {
        if (squad_row_check(&model, &rb.row, &err) == 0) {
            const squad_row *r = &rb.row;
            if (r->n_ids < 1 || r->n_slots < 1 || r->n_letters < 1) abort();
            for (int i = 0; i < r->n_slots; i++) {
                if (r->slots[i] < 0 || r->slots[i] >= r->n_ids) abort();
                if (i && r->slots[i] <= r->slots[i - 1]) abort();
                if (r->nopts[i] < 1 || r->nopts[i] > r->n_letters) abort();
            }
            for (int i = 0; i < r->n_ids; i++)
                if (r->ids[i] < 0 || r->ids[i] >= 300) abort();
        } else if (!err.msg[0]) {
            abort(); /* a refusal always says why */
        }
        squad_row_buf_free(&rb);
    } else if (!err.msg[0]) {
        abort();
    }
    return 0;
}
