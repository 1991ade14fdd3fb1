// cli.h - the subcommands of offload-run. The CLI is a client of triforce.h and nothing else.
#ifndef TRI_CLI_H
#define TRI_CLI_H

#include <stdio.h>

#include "triforce.h"

// Each takes the arguments after "offload-run" (argv[0] is the subcommand's name) and returns
// the process exit status: 0 ok, 1 failure, 2 bad usage.
int tri_cli_info(int argc, char **argv);
int tri_cli_plan(int argc, char **argv);
int tri_cli_generate(int argc, char **argv);
int tri_cli_tokenize(int argc, char **argv);
int tri_cli_chat(int argc, char **argv);
int tri_cli_template(int argc, char **argv);

// `generate` with several prompts (cli-generate-batch.c): what generate parsed.
typedef struct tri_cli_several {
    const char *const *files;  // -f FILE, each a prompt
    int32_t n_files;
    const char *prompts_path;  // --prompts FILE.jsonl, or NULL
    bool chat;
    tri_chat_format chat_format;
    const char *system_msg;
    bool print_ids, print_stats;
    long ctx;                  // 0: the longest prompt + n_predict (+ 4096 with n_predict 0)
    tri_session_params sp;     // every field but n_ctx
    tri_generate_params gp;    // n_predict, stop_at_eos, sampler
    const tri_spec_params *spec;  // --spec: one engine per prompt, generating together (tri_spec_batch);
                                  // NULL: plain decoding
    const char *json_path;        // --json FILE: the figures of the batch and of each prompt; NULL: none
    const char *model_path;       // -m as given, for --json
} tri_cli_several;
// Tokenizes every prompt, runs them as a batch (their prefills packed into shared passes, their
// decode steps together) and prints each output under a "==> SOURCE <==" line; returns the exit
// status.
int tri_cli_generate_several(tri_model *model, const tri_cli_several *a);

// ---- messages ----
// Every message of a subcommand starts with its name, "offload-run generate: ", getopt's too:
// main sets the name (and passes it as the subcommand's argv[0]) before running it.
void tri_cli_set_command(const char *command);
// "offload-run" or "offload-run COMMAND"; static storage.
const char *tri_cli_name(void);

// Prints "offload-run COMMAND: <what>: <last error>" to stderr; returns 1. A last error that starts
// with the command's own word ("plan: ...") loses it, so that no line says "plan: plan:".
int tri_cli_fail(const char *what, tri_status status);

// A usage error in one line, "offload-run COMMAND: <message>", then "see 'offload-run COMMAND
// --help'" instead of the whole help; returns 2. tri_cli_see_help prints only the second line
// (after getopt's own line for an unknown option or a missing value).
int tri_cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int tri_cli_see_help(void);

// Loads a model with progress on stderr: a line rewritten in place on a terminal, else a line at
// each tenth ("loading model: 40%"). Returns NULL after printing the error.
tri_model *tri_cli_load_model(const char *path);

// "24G", "512M", "100GiB", "1.5T", "123456" (powers of 1024): bytes. false on anything else.
bool tri_cli_parse_size(const char *s, uint64_t *out);
// A whole decimal number / a real number in [lo, hi] for option opt of command cmd; false after
// printing an error that names both.
bool tri_cli_parse_long(const char *cmd, const char *opt, const char *s, long lo, long hi, long *out);
bool tri_cli_parse_float(const char *cmd, const char *opt, const char *s, double lo, double hi, float *out);
// Parses "0-7,20,22" into strictly increasing layer indices (malloc'd, the caller frees); NULL
// after printing an error that names cmd and opt.
int32_t *tri_cli_parse_layers(const char *cmd, const char *opt, const char *arg, int32_t *n_out);
// Whether an option given (set) is one that applies (ok); false after printing that opt applies
// only to where.
bool tri_cli_applies(const char *cmd, const char *opt, bool set, bool ok, const char *where);
// A KV cache type by name: f16, f32, q8_0 or q4_0 (what the session may hold); false after printing
// an error that names cmd and opt.
bool tri_cli_parse_kv_type(const char *cmd, const char *opt, const char *arg, tri_dtype *out);

// Parses --device: "cpu", "cuda" (device 0) or "cuda:N" into sp's device fields. Prints
// "<cmd>: --device '<arg>': ..." and returns false for anything else.
bool tri_cli_parse_device(const char *cmd, const char *arg, tri_session_params *sp);

// Monotonic seconds.
double tri_cli_now(void);
// The process's peak resident memory in bytes (getrusage), 0 if unknown.
uint64_t tri_cli_peak_rss(void);

// Whether a file of ours may be written at path: it does not exist, is empty, or is a regular
// file that starts with ours (the bytes of prefix: what the writer puts first). Otherwise prints
// "<cmd>: <what> <path>: not replaced: ..." and returns false: a file the user gave by mistake
// (a document, a model) is never overwritten.
bool tri_cli_may_replace(const char *cmd, const char *what, const char *path, const char *prefix);

// The first bytes of `generate --json` and `chat --json` files, and of chat's /save transcripts.
#define TRI_CLI_JSON_PREFIX "{\"command\": \""
#define TRI_CLI_TRANSCRIPT_PREFIX "{\"messages\": ["

// --json: "-" is stdout, else a file created (an existing one only when it is one of ours,
// tri_cli_may_replace); NULL after printing the error. Close reports a write error (and returns
// false).
FILE *tri_cli_json_open(const char *cmd, const char *path);
bool tri_cli_json_close(const char *cmd, const char *path, FILE *f);
// Writes len bytes as a JSON string, quotes included (control bytes escaped).
void tri_cli_json_str(FILE *f, const char *s, size_t len);

// The conversation rendered with the model's chat template (format AUTO) or the named format,
// ending with the assistant's header: malloc'd, *len bytes. NULL after printing the error.
char *tri_cli_render_chat(const char *cmd, const tri_model *model, tri_chat_format format,
                          const tri_chat_message *msgs, size_t n, size_t *len);

// Reads a prompt from path ('-': stdin) into a NUL-terminated malloc'd buffer of *len bytes, at
// most max_bytes: more is refused with "offload-run COMMAND: PATH: longer than <max_bytes> bytes,
// <too_long>" rather than read without end (/dev/zero). A FIFO, pipe or terminal that has
// nothing to read yet gets a note on stderr that the command waits for its input, and how it
// ends. NULL after printing the error.
char *tri_cli_read_prompt(const char *path, uint64_t max_bytes, const char *too_long, size_t *len);
// When fd is a FIFO, pipe or socket with nothing to read within a second, prints "offload-run
// COMMAND: waiting for <what> on <name> (a FIFO or pipe): <how>" and returns true; else false at
// once (a file, a terminal, or input already there).
bool tri_cli_wait_note(int fd, const char *name, const char *what, const char *how);
// The most bytes of text n_tokens tokens of model can decode to (its longest token's bytes
// times n_tokens), the bound for tri_cli_read_prompt; *longest receives that token's length.
uint64_t tri_cli_prompt_bytes(const tri_model *model, int64_t n_tokens, size_t *longest);

// Token ids of text, malloc'd (*n_out of them); NULL after printing the error.
int32_t *tri_cli_text_ids(const char *cmd, const tri_model *model, const char *text, size_t len, bool add_special,
                          bool parse_special, int32_t *n_out);

// ---- sampling options (cli-sampling.c), shared by generate and chat and chat's /set ----

// getopt ids of the sampling options: TRI_CLI_OPT_SAMPLING + i for the i-th of
// TRI_CLI_SAMPLING_OPTIONS, which a command puts in its option table.
#define TRI_CLI_OPT_SAMPLING 0x1000
#define TRI_CLI_SAMPLING_COUNT 9
#define TRI_CLI_SAMPLING_OPTIONS                                                                              \
    {"temp", required_argument, NULL, TRI_CLI_OPT_SAMPLING + 0},                                              \
        {"top-k", required_argument, NULL, TRI_CLI_OPT_SAMPLING + 1},                                         \
        {"top-p", required_argument, NULL, TRI_CLI_OPT_SAMPLING + 2},                                         \
        {"min-p", required_argument, NULL, TRI_CLI_OPT_SAMPLING + 3},                                         \
        {"repeat-penalty", required_argument, NULL, TRI_CLI_OPT_SAMPLING + 4},                                \
        {"presence-penalty", required_argument, NULL, TRI_CLI_OPT_SAMPLING + 5},                              \
        {"frequency-penalty", required_argument, NULL, TRI_CLI_OPT_SAMPLING + 6},                             \
        {"repeat-last-n", required_argument, NULL, TRI_CLI_OPT_SAMPLING + 7},                                 \
        {"seed", required_argument, NULL, TRI_CLI_OPT_SAMPLING + 8}

// The sampler settings of a command: what the options gave, the rest from the defaults.
typedef struct tri_cli_sampling {
    tri_sampler_params p;
    unsigned given;  // bit i: the i-th option (or /set key) was given
} tri_cli_sampling;

// Handles getopt's c when it is a sampling option (sets *handled); false after printing an error
// that names cmd, the option and the value.
bool tri_cli_sampling_option(const char *cmd, int c, const char *arg, tri_cli_sampling *s, bool *handled);
// The same by name, for chat's "/set KEY VALUE": temp, top-k, top-p, min-p, repeat-penalty,
// presence-penalty, frequency-penalty, repeat-last-n, seed ('_' for '-' accepted).
bool tri_cli_sampling_set(const char *cmd, const char *key, const char *value, tri_cli_sampling *s);
// Fills what was not given: the chat settings (tri_sampler_chat_params) when chat, else greedy;
// a seed drawn here unless --seed was given, so that it can be printed and repeated.
void tri_cli_sampling_resolve(tri_cli_sampling *s, bool chat);
// "temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, seed 42" (what is on), or "greedy".
void tri_cli_sampling_describe(const tri_cli_sampling *s, char *buf, size_t cap);
// The options' help lines; chat: its defaults.
void tri_cli_sampling_usage(FILE *f, bool chat);

// ---- engine options (cli-engine.c), shared by generate and serve ----
// What builds a session or a speculative engine: --device, --kv-type, the KV cache policy of plain
// decoding, speculative decoding and its drafters, and placement. Both commands parse them here,
// so that they accept and refuse the same values with the same messages and help, and place the
// model with the same planner.

// getopt ids of the engine options: TRI_CLI_OPT_ENGINE + i for the i-th of TRI_CLI_ENGINE_OPTIONS,
// which a command puts in its option table.
#define TRI_CLI_OPT_ENGINE 0x1100
#define TRI_CLI_ENGINE_COUNT 29
#define TRI_CLI_ENGINE_OPTIONS                                                                                \
    {"device", required_argument, NULL, TRI_CLI_OPT_ENGINE + 0},                                              \
        {"kv-type", required_argument, NULL, TRI_CLI_OPT_ENGINE + 1},                                         \
        {"kv-offload", required_argument, NULL, TRI_CLI_OPT_ENGINE + 2},                                      \
        {"stream-weights", required_argument, NULL, TRI_CLI_OPT_ENGINE + 3},                                  \
        {"weights-from-disk", required_argument, NULL, TRI_CLI_OPT_ENGINE + 4},                               \
        {"gpu-mem", required_argument, NULL, TRI_CLI_OPT_ENGINE + 5},                                         \
        {"host-mem", required_argument, NULL, TRI_CLI_OPT_ENGINE + 6},                                        \
        {"kv-host", required_argument, NULL, TRI_CLI_OPT_ENGINE + 7},                                         \
        {"host-attn-gbps", required_argument, NULL, TRI_CLI_OPT_ENGINE + 8},                                  \
        {"kv", required_argument, NULL, TRI_CLI_OPT_ENGINE + 9},                                              \
        {"budget", required_argument, NULL, TRI_CLI_OPT_ENGINE + 10},                                         \
        {"kv-budget", required_argument, NULL, TRI_CLI_OPT_ENGINE + 11},                                      \
        {"chunk", required_argument, NULL, TRI_CLI_OPT_ENGINE + 12},                                          \
        {"kv-chunk", required_argument, NULL, TRI_CLI_OPT_ENGINE + 13},                                       \
        {"sink", required_argument, NULL, TRI_CLI_OPT_ENGINE + 14},                                           \
        {"refresh", required_argument, NULL, TRI_CLI_OPT_ENGINE + 15},                                        \
        {"kv-index", required_argument, NULL, TRI_CLI_OPT_ENGINE + 16},                                       \
        {"spec", required_argument, NULL, TRI_CLI_OPT_ENGINE + 17},                                           \
        {"draft", required_argument, NULL, TRI_CLI_OPT_ENGINE + 18},                                          \
        {"draft-layers", required_argument, NULL, TRI_CLI_OPT_ENGINE + 19},                                   \
        {"draft-ngram", required_argument, NULL, TRI_CLI_OPT_ENGINE + 20},                                    \
        {"gamma1", required_argument, NULL, TRI_CLI_OPT_ENGINE + 21},                                         \
        {"gamma2", required_argument, NULL, TRI_CLI_OPT_ENGINE + 22},                                         \
        {"tree-nodes", required_argument, NULL, TRI_CLI_OPT_ENGINE + 23},                                     \
        {"draft-window", required_argument, NULL, TRI_CLI_OPT_ENGINE + 24},                                   \
        {"draft-sink", required_argument, NULL, TRI_CLI_OPT_ENGINE + 25},                                     \
        {"draft-kv-type", required_argument, NULL, TRI_CLI_OPT_ENGINE + 26},                                  \
        {"refresh-accept", required_argument, NULL, TRI_CLI_OPT_ENGINE + 27},                                 \
        {"kv-mixed-heavy", required_argument, NULL, TRI_CLI_OPT_ENGINE + 28}

// The engine options of a command: what they gave, and the parameters they make.
typedef struct tri_cli_engine {
    tri_session_params sp;     // the command sets n_ctx, n_threads and n_batch
    tri_spec_params spec;      // mode TRI_SPEC_MODE_NONE unless --spec
    const char *draft_path;    // --draft MODEL, or NULL
    const char *draft_layers;  // --draft-layers L as given, or NULL
    // 0: not given (each of these wants a positive number, --tree-nodes a non-negative one)
    long ngram, gamma1, gamma2, tree_nodes, budget, chunk, sink, refresh, draft_window, draft_sink;
    long kv_offload, stream_weights, weights_from_disk;  // layers
    float kv_host;             // fraction of an offloaded layer's rows attended on the host
    float host_attn_gbps;      // 0: measured when the planner runs on a GPU
    uint64_t gpu_mem, host_mem;  // bytes; 0: not given
    tri_dtype draft_kv;
    bool kv_set, index_set, draft_kv_set, refresh_accept_set;
    bool kv_offload_set, stream_weights_set, weights_from_disk_set, kv_host_set;
    // tri_cli_engine_load_drafter's, freed by tri_cli_engine_free
    tri_model *draft;
    int32_t *layers;
} tri_cli_engine;

// The defaults: the library's session and speculative parameters, plain decoding.
void tri_cli_engine_init(tri_cli_engine *e);
// Handles getopt's c when it is an engine option (sets *handled); false after printing an error
// that names cmd, the option and the value.
bool tri_cli_engine_option(const char *cmd, int c, const char *arg, tri_cli_engine *e, bool *handled);
// Once every option is parsed: refuses a drafter without the mode that needs one (and the reverse),
// and an option that does nothing under the chosen --kv policy or --spec mode; then writes what the
// options gave into e->sp and e->spec. False after printing the one-line error (a usage error).
bool tri_cli_engine_check(const char *cmd, tri_cli_engine *e);
// Placement, with e->sp.n_ctx set: on a GPU, or when --gpu-mem gives a budget, the planner chooses
// the offloaded KV layers, the streamed weights, the layers read from disk and the host's share of
// attention that the options did not give, for one of n_slots sessions that share the device and
// host budgets evenly. Writes the plan's lines into line (n bytes; "" when there is nothing to
// place), for the caller to print once its sessions exist. False after printing an error.
bool tri_cli_engine_place(const tri_model *model, tri_cli_engine *e, int32_t n_slots, char *line, size_t n);
// Loads --draft's model and parses --draft-layers into e->spec. Returns 0, or the exit status after
// printing the error (1: the model, 2: the layers).
int tri_cli_engine_load_drafter(const char *cmd, tri_cli_engine *e);
// Frees what tri_cli_engine_load_drafter made; the struct may be freed again.
void tri_cli_engine_free(tri_cli_engine *e);
// The options' help lines: device and placement, the KV cache policy, speculative decoding.
void tri_cli_engine_usage(FILE *f);

#endif  // TRI_CLI_H
