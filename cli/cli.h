// cli.h - the subcommands of offload-run. The CLI is a client of triforce.h and nothing else.
#ifndef TRI_CLI_H
#define TRI_CLI_H

#include "triforce.h"

// Each takes the arguments after "offload-run" (argv[0] is the subcommand's name) and returns
// the process exit status: 0 ok, 1 failure, 2 bad usage.
int tri_cli_info(int argc, char **argv);
int tri_cli_plan(int argc, char **argv);
int tri_cli_generate(int argc, char **argv);
int tri_cli_tokenize(int argc, char **argv);

// Prints "offload-run: <what>: <last error>" to stderr; returns 1.
int tri_cli_fail(const char *what, tri_status status);

// Loads a model with a progress line on stderr when it is a terminal. Returns NULL after printing
// the error.
tri_model *tri_cli_load_model(const char *path);

// "24G", "512M", "100GiB", "1.5T", "123456" (powers of 1024): bytes. false on anything else.
bool tri_cli_parse_size(const char *s, uint64_t *out);

// Parses --device: "cpu", "cuda" (device 0) or "cuda:N" into sp's device fields. Prints
// "<cmd>: --device '<arg>': ..." and returns false for anything else.
bool tri_cli_parse_device(const char *cmd, const char *arg, tri_session_params *sp);

#endif  // TRI_CLI_H
