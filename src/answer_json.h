/*
 * answer_json.h — the JSON text of squad's own answers, shared by the CLI (`squad ask`, `squad
 * score`) and the server (`POST /v1/ask`, `POST /v1/score`), so the two print the same bytes for the
 * same answer.
 *
 * Text goes into a squad_buf (util.h), a growable string whose allocation failure is sticky (checked
 * once at the end), so the formatting code reads as a sequence of appends.
 */
#ifndef SQUAD_ANSWER_JSON_H
#define SQUAD_ANSWER_JSON_H

#include <stddef.h>

#include "squad.h"
#include "template.h"
#include "util.h"

/* s as a JSON string literal, escaped as jansson writes it. */
void squad_buf_json_string(squad_buf *b, const char *s);
/* Hands the text over (the caller frees it) and empties b; NULL when an append failed. */
/* squad ask's answer up to its timing: {"answers": [...], "tokens": {"state": n, "computed": m,
 * "reused": r} — without the "ms" field and the closing brace, which the caller adds (the server
 * adds its own fields there). computed / reused are the totals to report. With specialists (sp not
 * NULL) each answer adds "route", and the answer adds the first row's "route" and "router"
 * ({label: probability}). */
void squad_ask_json_head(squad_buf *b, const squad_text_rows *rows, const squad_result *results,
                         const squad_specialists *sp, long computed, long reused);
/* The same with computed / reused as text written as it is (the server's memo placeholders). */
void squad_ask_json_head_text(squad_buf *b, const squad_text_rows *rows, const squad_result *results,
                              const squad_specialists *sp, const char *computed, const char *reused);

/* squad score's line for one answered row (without the newline):
 * {"probs": [[...], ...], "reused": R, "computed": C}, plus "route": "label" and "router": [p, ...]
 * with specialists (sp not NULL). */
void squad_score_result_json(squad_buf *b, const squad_row *row, const squad_result *r,
                             const squad_specialists *sp);
/* The same with reused / computed as text written as it is (the server's memo placeholders). */
void squad_score_result_json_text(squad_buf *b, const squad_row *row, const squad_result *r,
                                  const squad_specialists *sp, const char *reused, const char *computed);
/* squad score's line for a row that failed: {"error":"..."} (jansson's compact form). */
void squad_score_error_json(squad_buf *b, const char *msg);

#endif /* SQUAD_ANSWER_JSON_H */
