// server.h - `offload-run serve`, the OpenAI-compatible HTTP server: what its files share.
//
// The server is a client of include/triforce.h only (ARCHITECTURE.md), linked into offload-run;
// it reuses the CLI's option parsers (cli.h). server.c owns the HTTP side (libmicrohttpd), the
// slots and their queue; server-json.c turns request bodies into token ids and sampling
// parameters and generation results into OpenAI's JSON. docs/server.md documents the endpoints.
#ifndef TRI_SERVER_H
#define TRI_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "triforce.h"

// `offload-run serve ...` (argv[0] is "serve"): the process exit status, as the CLI's commands.
int tri_server_main(int argc, char **argv);

// ---- errors in OpenAI's shape ----

// {"error": {"message", "type", "param", "code"}} with an HTTP status.
typedef struct srv_error {
    int status;           // 400, 401, 404, 405, 413, 500, 503
    const char *type;     // "invalid_request_error", "authentication_error", "server_error"
    const char *code;     // OpenAI's codes where one fits ("model_not_found"), else NULL (null)
    char param[64];       // the request field at fault, "" for none (null)
    char message[512];
} srv_error;

// Sets err (printf-style message); returns false, for `return srv_fail(...)`.
bool srv_fail(srv_error *err, int status, const char *type, const char *code, const char *param, const char *fmt,
              ...) __attribute__((format(printf, 6, 7)));
// The error as a JSON body, malloc'd; NULL out of memory.
char *srv_error_json(const srv_error *err);

// ---- sampling: the request's fields over the server's defaults ----

// The sampling fields a request may set, each with whether it was given; srv_sampling_apply is the
// one place that maps them onto tri_sampler_params.
typedef struct srv_sampling {
    bool has_temperature, has_top_p, has_top_k, has_min_p, has_seed;
    bool has_presence_penalty, has_frequency_penalty, has_repeat_penalty, has_repeat_last_n;
    double temperature;        // [0, 2]
    double top_p;              // (0, 1]
    int64_t top_k;             // >= 0, 0: all
    double min_p;              // [0, 1]
    uint64_t seed;
    double presence_penalty;   // [-2, 2]
    double frequency_penalty;  // [-2, 2]
    double repeat_penalty;     // > 0, 1: none
    int64_t repeat_last_n;     // llama.cpp's: the penalties' window; -1: the whole context, 0: penalties off
} srv_sampling;

// Writes into *out the sampling of a request: each field the request gives (req), else the
// server's default (dflt: the start-up options), else the API's default. A field the API cannot
// apply yet fails (400 naming it) unless it has its neutral value. *explicit_seed says whether a
// seed was given (by the request or --seed).
bool srv_sampling_apply(const srv_sampling *req, const srv_sampling *dflt, tri_sampler_params *out,
                        bool *explicit_seed, srv_error *err);

// ---- requests ----

#define SRV_MAX_STOP 16

// One completion request, parsed and checked, its prompt as token ids.
typedef struct srv_request {
    bool chat;             // /v1/chat/completions (else /v1/completions)
    bool stream;           // server-sent events
    bool include_usage;    // stream_options.include_usage: a last chunk with the usage
    bool ignore_eos;       // go on past the end-of-sequence and end-of-turn tokens (llama-server's)
    int32_t *ids;          // the prompt (a chat: the conversation rendered), malloc'd
    int32_t n_ids;
    int64_t max_tokens;    // 0: not given
    char *stop[SRV_MAX_STOP];  // malloc'd
    int32_t n_stop;
    srv_sampling sampling;
} srv_request;

// What the parser needs of the server.
typedef struct srv_model_ref {
    const tri_model *model;
    const char *id;        // the model's name in requests and /v1/models
    const char *path;      // -m as given, also accepted as the name
    tri_chat_format chat_format;  // AUTO: the model's template
    bool chat_ok;          // the model can render a conversation
    const char *chat_why;  // why not, when !chat_ok
    int32_t n_ctx;         // the context of a slot
} srv_model_ref;

// Parses the body (len bytes) of a completion request into rq. False with err set for invalid
// JSON, a field of the wrong type or out of range, an unsupported field, an unknown model, a
// conversation the template refuses, or a prompt that leaves no room in the context.
bool srv_parse_request(const srv_model_ref *m, bool chat, const char *body, size_t len, srv_request *rq,
                       srv_error *err);
void srv_request_free(srv_request *rq);

// ---- text: an answer's tokens turned into text, with stop strings (server-text.c) ----

// Called with text that is final (len bytes, NUL-terminated, valid during the call); false: stop.
typedef bool (*srv_text_fn)(const char *text, size_t len, void *user);

// What tri_generate_params' stop, stop_tokens and on_text do inside tri_generate, for a slot whose
// tokens the scheduler samples itself: the same text, held back and cut the same way.
typedef struct srv_text {
    const char *const *stop;     // n_stop non-empty strings, the caller's (they must outlive t)
    int32_t n_stop;
    const int32_t *stop_tokens;  // n_stop_tokens end-of-turn ids, the caller's
    int32_t n_stop_tokens;
    srv_text_fn on_text;
    void *user;
    tri_detokenizer *detok;
    char *held;                  // (cap + 1) bytes: decoded text not yet handed to on_text
    size_t n_held, cap, max_stop;
    bool stopped;                // a stop string or a stop token ended the answer
    bool stop_token;             // ... a stop token
    bool refused;                // on_text returned false
    tri_status err;              // out of memory, or the detokenizer's failure
} srv_text;

tri_status srv_text_init(srv_text *t, const tri_model *model, const char *const *stop, int32_t n_stop,
                         const int32_t *stop_tokens, int32_t n_stop_tokens, srv_text_fn on_text, void *user);
// One generated token (emitted, counted): false when the answer ends here (a stop token, a stop
// string, on_text's stop, or t->err).
bool srv_text_push(srv_text *t, int32_t token);
// The end of an answer that no stop ended: the text held back goes out. t->err or the detokenizer's.
tri_status srv_text_finish(srv_text *t);
void srv_text_free(srv_text *t);

// ---- responses ----

// What a generation gave, for the response's JSON.
typedef struct srv_result {
    const char *id;              // "chatcmpl-..." / "cmpl-..."
    int64_t created;             // Unix seconds
    const char *model;
    const char *text;            // the whole text (non-streamed responses)
    size_t n_text;
    const char *finish_reason;   // "stop", "length"
    int32_t prompt_tokens, cached_tokens, completion_tokens;
    // the `triforce` object
    int32_t slot;
    const char *mode;            // "none", "draft", "retrieval", "triforce"
    double queue_seconds, prefill_seconds, decode_seconds;
    bool spec;                   // the figures below are set
    int64_t batch_passes;        // plain decoding: the batched passes that ran this request's
    int64_t batch_sequences;     // tokens, and the sequences they carried in all (this one included)
    int64_t full_cache_passes, l1_proposed, l1_accepted, l2_proposed, l2_accepted;
} srv_result;

// The whole response of a non-streamed request; malloc'd, NULL out of memory.
char *srv_response_json(bool chat, const srv_result *r);
// One streamed chunk as an SSE event ("data: {...}\n\n"), malloc'd, *len bytes: a piece of text
// (first: with the assistant's role, chat only), or with r->finish_reason set the closing chunk
// (empty delta, with the triforce figures), or with usage_only the chunk of the usage.
char *srv_chunk_sse(bool chat, const srv_result *r, const char *text, size_t n_text, bool first, bool usage_only,
                    size_t *len);
// /v1/models and /v1/models/{id}; malloc'd.
char *srv_models_json(const srv_model_ref *m, int64_t created, bool one);

// ---- llama-server's other endpoints (server-json.c) ----

// POST /tokenize: {"content": TEXT, "add_special": false, "parse_special": true, "with_pieces":
// false} -> {"tokens": [ids]} (with_pieces: [{"id": N, "piece": TEXT}], a piece that is not
// valid UTF-8 as its list of byte values). *out malloc'd; false with err set for a bad body.
bool srv_tokenize_json(const srv_model_ref *m, const char *body, size_t len, char **out, srv_error *err);
// POST /detokenize: {"tokens": [ids]} -> {"content": TEXT} (special tokens rendered).
bool srv_detokenize_json(const srv_model_ref *m, const char *body, size_t len, char **out, srv_error *err);

// One slot as /slots shows it.
typedef struct srv_slot_info {
    int id;
    bool processing;
    int32_t n_cached;  // tokens its cache holds
} srv_slot_info;
// GET /slots: [{"id", "n_ctx", "speculative", "is_processing", "n_cached"}]; malloc'd.
char *srv_slots_json(const srv_model_ref *m, const srv_slot_info *slots, int n, bool speculative);
// GET /props: the default generation settings, the slots, the model; malloc'd.
char *srv_props_json(const srv_model_ref *m, const srv_sampling *dflt, int64_t n_predict, int n_slots,
                     const char *mode);

#endif  // TRI_SERVER_H
