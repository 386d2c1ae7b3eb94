/*
 * main.c — the squad command line: dispatches `squad CMD ...` to the subcommands in src/cli/.
 * The CLI is a thin layer over libsquad (include/squad.h).
 */
#include <stdio.h>
#include <string.h>

#include "commands.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command COMMANDS[] = {
    {"score", cmd_score, "answer rows (JSON lines of token ids) with a model"},
    {"ask", cmd_ask, "answer a text request (state + questions) end to end"},
    {"serve", cmd_serve, "the HTTP service: squad's API and the decision APIs (docs/server.md)"},
    {"tokenize", cmd_tokenize, "text -> token ids with a tokenizer.json"},
    {"detokenize", cmd_detokenize, "token ids -> text"},
    {"synth", cmd_synth, "write a deterministic random checkpoint (Hugging Face layout)"},
    {"bench", cmd_bench, "time cold and cached rows on a model"},
};

static void usage(FILE *f) {
    fprintf(f,
            "squad: multiple-choice answers from a Qwen3.5-architecture model, with a cross-request state cache\n"
            "\n"
            "usage: squad COMMAND [options]   (squad COMMAND --help for its options; an option's value\n"
            "                                   follows it, --threads 4, or is attached, --threads=4)\n"
            "\n"
            "commands:\n");
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        fprintf(f, "  %-11s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        if (!strcmp(argv[1], COMMANDS[i].name)) return COMMANDS[i].run(argc - 1, argv + 1);
    fprintf(stderr, "squad: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
