/*
 * commands.h — the squad CLI's subcommands. Each is `int cmd_NAME(int argc, char **argv)` where
 * argv[0] is the subcommand name; it returns the process exit code (0 ok, 1 some rows failed,
 * 2 usage or model error) and prints its own --help.
 */
#ifndef SQUAD_CLI_COMMANDS_H
#define SQUAD_CLI_COMMANDS_H

int cmd_score(int argc, char **argv);      /* cli/score.c */
int cmd_synth(int argc, char **argv);      /* cli/synth.c */
int cmd_tokenize(int argc, char **argv);   /* cli/tokenize.c */
int cmd_detokenize(int argc, char **argv); /* cli/tokenize.c */
int cmd_ask(int argc, char **argv);        /* cli/ask.c */
int cmd_bench(int argc, char **argv);      /* cli/bench.c */
int cmd_serve(int argc, char **argv);      /* cli/serve.c */

#endif
