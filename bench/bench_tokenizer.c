/*
 * bench_tokenizer.c — single-threaded tokenizer throughput (MB/s and tokens/s) on a few MB of mixed
 * text, for comparison with Hugging Face tokenizers on the same documents (bench/bench_tokenizer_hf.js).
 *
 *   bench_tokenizer [TOKENIZER.json | --tokenizer FILE] [--docs FILE.jsonl] [--write-docs FILE.jsonl]
 *                   [--mb N] [--passes N]
 *
 * Without --docs it generates the documents itself, deterministically (a fixed seed): English-like
 * prose whose words follow a Zipf law over the tokenizer's own word tokens, code, JSON, HTML-like
 * web-app states, CJK text and the strings of the tokenizer test corpus. --write-docs saves them as
 * JSON lines (one string per document) so the reference benchmark reads exactly the same text.
 * Every pass encodes each document separately (as an application would); the first pass starts with
 * a cold word cache, later passes find it warm. The total token count is printed so the two
 * benchmarks can be checked against each other. Each pass reports wall time and process CPU time:
 * on a shared machine the CPU-time figure is the steadier one (the bench is single-threaded).
 */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer.h"
#include "util.h"

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r) { /* xorshift64* */
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1Dull;
}

static double rng_unit(rng *r) { return (double)(rng_next(r) >> 11) / 9007199254740992.0; }
static int rng_int(rng *r, int n) { return (int)(rng_next(r) % (uint64_t)n); }

typedef struct strbuf {
    char *s;
    size_t n, cap;
} strbuf;

static void sb_put(strbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n + 1) cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            fprintf(stderr, "bench_tokenizer: out of memory\n");
            exit(2);
        }
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}
static void sb_str(strbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* The tokenizer's word tokens (" word", lowercase letters, 3+ long) in id order: earlier BPE merges
 * are more frequent, so rank by id and draw with a Zipf law. */
typedef struct wordlist {
    char **w;
    int n;
    double *cdf;
} wordlist;

static int collect_words(squad_tokenizer *tok, wordlist *wl) {
    int v = squad_tokenizer_vocab_size(tok);
    wl->w = calloc((size_t)v, sizeof(char *));
    wl->cdf = calloc((size_t)v, sizeof(double));
    if (!wl->w || !wl->cdf) return -1;
    squad_err err;
    for (int32_t id = 0; id < v && wl->n < 20000; id++) {
        char *text;
        size_t len;
        if (squad_detokenize(tok, &id, 1, 0, &text, &len, &err) < 0) continue;
        int ok = len >= 4 && text[0] == ' ';
        for (size_t i = 1; ok && i < len; i++) ok = text[i] >= 'a' && text[i] <= 'z';
        if (ok) wl->w[wl->n++] = text;
        else free(text);
    }
    double total = 0;
    for (int i = 0; i < wl->n; i++) wl->cdf[i] = (total += 1.0 / (i + 10.0));
    for (int i = 0; i < wl->n; i++) wl->cdf[i] /= total;
    return wl->n > 100 ? 0 : -1;
}

static const char *zipf_word(const wordlist *wl, rng *r) {
    double u = rng_unit(r);
    int lo = 0, hi = wl->n - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (wl->cdf[mid] < u) lo = mid + 1;
        else hi = mid;
    }
    return wl->w[lo];
}

static void gen_prose(strbuf *b, const wordlist *wl, rng *r, size_t target) {
    static const char *punct[] = {".", ".", ".", "?", "!", ",", ";", ":"};
    while (b->n < target) {
        int words = 5 + rng_int(r, 20);
        for (int i = 0; i < words; i++) {
            const char *w = zipf_word(wl, r);
            if (i == 0) { /* capitalised, no leading space at a paragraph start */
                char tmp[64];
                snprintf(tmp, sizeof tmp, "%s", w + 1);
                tmp[0] = (char)(tmp[0] - 32);
                if (b->n && b->s[b->n - 1] != '\n') sb_str(b, " ");
                sb_str(b, tmp);
            } else {
                sb_str(b, w);
            }
            int x = rng_int(r, 100);
            if (x < 3) sb_str(b, "'s");
            else if (x < 5) sb_str(b, ",");
            else if (x < 7) {
                char num[24];
                snprintf(num, sizeof num, " %d", rng_int(r, 100000));
                sb_str(b, num);
            }
        }
        sb_str(b, punct[rng_int(r, 8)]);
        if (rng_int(r, 6) == 0) sb_str(b, "\n\n");
    }
}

static void gen_code(strbuf *b, const wordlist *wl, rng *r, size_t target) {
    while (b->n < target) {
        int depth = rng_int(r, 4);
        for (int i = 0; i < depth; i++) sb_str(b, "    ");
        const char *a = zipf_word(wl, r) + 1, *c = zipf_word(wl, r) + 1;
        char line[256];
        switch (rng_int(r, 5)) {
        case 0: snprintf(line, sizeof line, "def %s_%s(self, %s=None):\n", a, c, c); break;
        case 1: snprintf(line, sizeof line, "%s = %s.get(\"%s\", %d)\n", a, c, a, rng_int(r, 1000)); break;
        case 2: snprintf(line, sizeof line, "if (%s->%s != NULL && %s[%d] >= 0) {\n", a, c, a, rng_int(r, 64)); break;
        case 3: snprintf(line, sizeof line, "return %s(%s) + %d;  // %s %s\n", a, c, rng_int(r, 10), a, c); break;
        default: snprintf(line, sizeof line, "}\n"); break;
        }
        sb_str(b, line);
    }
}

static void gen_json(strbuf *b, const wordlist *wl, rng *r, size_t target) {
    sb_str(b, "{");
    while (b->n < target) {
        char item[256];
        snprintf(item, sizeof item, "\"%s\": {\"id\": %d, \"name\": \"%s%s\", \"ok\": %s, \"score\": %d.%02d}, ",
                 zipf_word(wl, r) + 1, rng_int(r, 100000), zipf_word(wl, r) + 1, zipf_word(wl, r),
                 rng_int(r, 2) ? "true" : "false", rng_int(r, 100), rng_int(r, 100));
        sb_str(b, item);
    }
    sb_str(b, "\"end\": null}");
}

static void gen_html(strbuf *b, const wordlist *wl, rng *r, size_t target) {
    static const char *tags[] = {"div", "span", "button", "label", "li", "a", "p", "h2"};
    while (b->n < target) {
        const char *t = tags[rng_int(r, 8)];
        char el[512];
        snprintf(el, sizeof el, "<%s class=\"%s-%s\" id=\"%s%d\">%s%s%s</%s>\n", t, zipf_word(wl, r) + 1,
                 zipf_word(wl, r) + 1, zipf_word(wl, r) + 1, rng_int(r, 100), zipf_word(wl, r) + 1, zipf_word(wl, r),
                 zipf_word(wl, r), t);
        sb_str(b, el);
        if (rng_int(r, 5) == 0) sb_str(b, "  <input type=\"text\" value=\"\" placeholder=\"Search\" disabled>\n");
    }
}

static void gen_cjk(strbuf *b, rng *r, size_t target) {
    static const char *punct[] = {"\xE3\x80\x82", "\xEF\xBC\x8C", "\xE3\x80\x81", "\xEF\xBC\x81"};
    while (b->n < target) {
        int n = 4 + rng_int(r, 30);
        for (int i = 0; i < n; i++) {
            /* common ideographs cluster at the start of the block; kana now and then */
            uint32_t cp = rng_int(r, 8) == 0 ? 0x3041 + (uint32_t)rng_int(r, 80)
                                               : 0x4E00 + (uint32_t)(rng_unit(r) * rng_unit(r) * 6000);
            char u[4] = {(char)(0xE0 | (cp >> 12)), (char)(0x80 | ((cp >> 6) & 0x3F)), (char)(0x80 | (cp & 0x3F)), 0};
            sb_str(b, u);
        }
        sb_str(b, punct[rng_int(r, 4)]);
    }
}

/* Documents: a JSON array of strings. */
static json_t *generate_docs(squad_tokenizer *tok, double mb) {
    wordlist wl = {0};
    if (collect_words(tok, &wl) < 0) {
        fprintf(stderr, "bench_tokenizer: the tokenizer has too few word tokens to generate text\n");
        exit(2);
    }
    json_t *corpus = json_array();
    FILE *f = fopen("tests/fixtures/tokenizer/corpus.jsonl", "r");
    char line[65536];
    while (f && fgets(line, sizeof line, f)) {
        json_t *s = json_loads(line, JSON_DECODE_ANY, NULL);
        if (json_is_string(s)) json_array_append(corpus, s);
        json_decref(s);
    }
    if (f) fclose(f);
    rng r = {0x5eed5eed12345678ull};
    json_t *docs = json_array();
    size_t total = 0, want = (size_t)(mb * 1e6);
    while (total < want) {
        strbuf b = {0};
        size_t target = 2000 + (size_t)rng_int(&r, 6000);
        int kind = rng_int(&r, 100);
        if (kind < 55) gen_prose(&b, &wl, &r, target);
        else if (kind < 65) gen_code(&b, &wl, &r, target);
        else if (kind < 75) gen_json(&b, &wl, &r, target);
        else if (kind < 85) gen_html(&b, &wl, &r, target);
        else if (kind < 95) gen_cjk(&b, &r, target);
        else
            while (b.n < target && json_array_size(corpus)) {
                sb_str(&b, json_string_value(json_array_get(corpus, (size_t)rng_int(&r, (int)json_array_size(corpus)))));
                sb_str(&b, "\n");
            }
        if (!b.n) sb_str(&b, "empty");
        json_array_append_new(docs, json_stringn(b.s, b.n));
        total += b.n;
        free(b.s);
    }
    for (int i = 0; i < wl.n; i++) free(wl.w[i]);
    free(wl.w);
    free(wl.cdf);
    json_decref(corpus);
    return docs;
}

static json_t *read_docs(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    json_t *docs = json_array();
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) > 0) {
        json_t *s = json_loadb(line, (size_t)n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        if (json_is_string(s)) json_array_append(docs, s);
        json_decref(s);
    }
    free(line);
    fclose(f);
    return docs;
}

static void usage(void) {
    fprintf(stderr, "usage: bench_tokenizer [TOKENIZER.json | --tokenizer FILE] [--docs FILE.jsonl] "
                    "[--write-docs FILE.jsonl] [--mb N] [--passes N]\n");
}

int main(int argc, char **argv) {
    const char *tok_path = "third_party/qwen3/tokenizer.json", *docs_path = NULL, *write_path = NULL;
    double mb = 4;
    int passes = 4;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) tok_path = argv[++i];
        else if (!strcmp(argv[i], "--docs") && i + 1 < argc) docs_path = argv[++i];
        else if (!strcmp(argv[i], "--write-docs") && i + 1 < argc) write_path = argv[++i];
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--passes") && i + 1 < argc) passes = atoi(argv[++i]);
        else if (argv[i][0] != '-') tok_path = argv[i];
        else {
            usage();
            return 2;
        }
    }
    if (passes < 1 || mb <= 0) {
        usage();
        return 2;
    }
    squad_err err = {0};
    double t0 = squad_now_seconds();
    squad_tokenizer *tok = squad_tokenizer_load(tok_path, &err);
    if (!tok) {
        fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
        return 2;
    }
    printf("load: %.3f s\n", squad_now_seconds() - t0);
    json_t *docs = docs_path ? read_docs(docs_path) : generate_docs(tok, mb);
    if (!docs || !json_array_size(docs)) {
        fprintf(stderr, "bench_tokenizer: no documents%s%s\n", docs_path ? " in " : "", docs_path ? docs_path : "");
        return 2;
    }
    size_t bytes = 0, nd = json_array_size(docs);
    for (size_t i = 0; i < nd; i++) bytes += json_string_length(json_array_get(docs, i));
    if (write_path) {
        FILE *f = fopen(write_path, "w");
        for (size_t i = 0; f && i < nd; i++) {
            char *s = json_dumps(json_array_get(docs, i), JSON_ENCODE_ANY | JSON_COMPACT);
            fprintf(f, "%s\n", s);
            free(s);
        }
        if (!f || fclose(f)) {
            fprintf(stderr, "bench_tokenizer: cannot write %s\n", write_path);
            return 2;
        }
    }
    printf("documents: %zu, %.2f MB\n", nd, bytes / 1e6);
    squad_idvec v = {0};
    double best = 1e30, best_cpu = 1e30;
    size_t tokens = 0;
    for (int p = 0; p < passes; p++) {
        tokens = 0;
        double t = squad_now_seconds(), c = cpu_seconds();
        for (size_t i = 0; i < nd; i++) {
            json_t *d = json_array_get(docs, i);
            v.n = 0;
            if (squad_tokenize_append(tok, json_string_value(d), json_string_length(d), 0, &v, &err) < 0) {
                fprintf(stderr, "bench_tokenizer: document %zu: %s\n", i, err.msg);
                return 1;
            }
            tokens += v.n;
        }
        t = squad_now_seconds() - t;
        c = cpu_seconds() - c;
        if (t < best) best = t;
        if (c < best_cpu) best_cpu = c;
        printf("pass %d%s: wall %.3f s (%.2f MB/s, %.0f tokens/s), cpu %.3f s (%.2f MB/s, %.0f tokens/s)\n", p + 1,
               p == 0 ? " (cold cache)" : "", t, bytes / 1e6 / t, tokens / t, c, bytes / 1e6 / c, tokens / c);
    }
    printf("tokens: %zu\n", tokens);
    printf("best wall: %.2f MB/s, %.0f tokens/s (single thread)\n", bytes / 1e6 / best, tokens / best);
    printf("best cpu:  %.2f MB/s, %.0f tokens/s (single thread)\n", bytes / 1e6 / best_cpu, tokens / best_cpu);
    squad_idvec_free(&v);
    json_decref(docs);
    squad_tokenizer_free(tok);
    return 0;
}
