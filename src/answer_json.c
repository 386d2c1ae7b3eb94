/*
 * answer_json.c — squad's own answer formats as text (see answer_json.h). Numbers keep the exact
 * printf formats the CLI has always used (%.6g for ask's probabilities, %.9g for score's), and the
 * strings that can carry request text go through jansson's own escaping.
 */
#include "answer_json.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void squad_buf_json_string(squad_buf *b, const char *s) {
    json_t *v = json_string(s);
    char *t = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    if (t) squad_buf_puts(b, t);
    else b->oom = 1;
    free(t);
    json_decref(v);
}

void squad_ask_json_head(squad_buf *b, const squad_text_rows *r, const squad_result *results,
                         const squad_specialists *sp, long computed, long reused) {
    char c[24], u[24];
    snprintf(c, sizeof c, "%ld", computed);
    snprintf(u, sizeof u, "%ld", reused);
    squad_ask_json_head_text(b, r, results, sp, c, u);
}

void squad_ask_json_head_text(squad_buf *b, const squad_text_rows *r, const squad_result *results,
                              const squad_specialists *sp, const char *computed, const char *reused) {
    squad_buf_puts(b, "{\"answers\": [");
    for (int q = 0; q < r->n_questions; q++) {
        int row = r->q_row[q], slot = r->q_slot[q], nopts = r->rows[row].nopts[slot], best = 0;
        const float *p = results[row].probs[slot];
        squad_buf_puts(b, q ? ", {\"probs\": [" : "{\"probs\": [");
        for (int k = 0; k < nopts; k++) {
            squad_buf_printf(b, k ? ", %.6g" : "%.6g", p[k]);
            if (p[k] > p[best]) best = k;
        }
        squad_buf_puts(b, "], \"choice\": ");
        squad_buf_json_string(b, r->labels[best]);
        squad_buf_printf(b, ", \"index\": %d", best);
        if (sp) {
            squad_buf_puts(b, ", \"route\": ");
            squad_buf_json_string(b, squad_specialists_label(sp, results[row].route));
        }
        squad_buf_puts(b, "}");
    }
    squad_buf_puts(b, "]");
    if (sp && r->n_rows > 0) {
        const squad_result *first = &results[0];
        squad_buf_puts(b, ", \"route\": ");
        squad_buf_json_string(b, squad_specialists_label(sp, first->route));
        squad_buf_puts(b, ", \"router\": {");
        for (int k = 0; k < first->n_routes; k++) {
            if (k) squad_buf_puts(b, ", ");
            squad_buf_json_string(b, squad_specialists_label(sp, k));
            squad_buf_printf(b, ": %.6g", first->route_probs[k]);
        }
        squad_buf_puts(b, "}");
    }
    squad_buf_printf(b, ", \"tokens\": {\"state\": %d, \"computed\": %s, \"reused\": %s}", r->state_len, computed,
                     reused);
}

void squad_score_result_json(squad_buf *b, const squad_row *row, const squad_result *r,
                             const squad_specialists *sp) {
    char u[16], c[16];
    snprintf(u, sizeof u, "%d", r->reused);
    snprintf(c, sizeof c, "%d", r->computed);
    squad_score_result_json_text(b, row, r, sp, u, c);
}

void squad_score_result_json_text(squad_buf *b, const squad_row *row, const squad_result *r,
                                  const squad_specialists *sp, const char *reused, const char *computed) {
    squad_buf_puts(b, "{\"probs\": [");
    for (int s = 0; s < r->n_slots; s++) {
        squad_buf_puts(b, s ? ", [" : "[");
        for (int l = 0; l < row->nopts[s]; l++) squad_buf_printf(b, l ? ", %.9g" : "%.9g", r->probs[s][l]);
        squad_buf_puts(b, "]");
    }
    squad_buf_printf(b, "], \"reused\": %s, \"computed\": %s", reused, computed);
    if (sp) {
        squad_buf_puts(b, ", \"route\": ");
        squad_buf_json_string(b, squad_specialists_label(sp, r->route));
        squad_buf_puts(b, ", \"router\": [");
        for (int k = 0; k < r->n_routes; k++) squad_buf_printf(b, k ? ", %.6g" : "%.6g", r->route_probs[k]);
        squad_buf_puts(b, "]");
    }
    squad_buf_puts(b, "}");
}

void squad_score_error_json(squad_buf *b, const char *msg) {
    json_t *o = json_pack("{s:s}", "error", msg);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    squad_buf_puts(b, s ? s : "{\"error\": \"out of memory\"}");
    free(s);
    json_decref(o);
}
