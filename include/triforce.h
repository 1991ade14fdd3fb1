/*
 * triforce.h - the public API of the offloading runtime.
 *
 * This header is the whole published interface: if a symbol does not appear here, it is not part
 * of the API and may change without notice.
 *
 * Conventions
 *   - Every handle is opaque and comes with a create/free pair; free(NULL) is a no-op.
 *   - Functions that can fail return a tri_status (0 ok, negative error). When one fails, a
 *     one-line message naming the file, the field and the problem is available from
 *     tri_last_error() on the same thread until that thread's next failing call.
 *   - Parameter structs come with a tri_*_default_params() function; fields are only ever added at
 *     the end.
 *   - The library never prints to stdout and never exits the process; it logs through the callback
 *     set with tri_log_set().
 */
#ifndef TRIFORCE_H
#define TRIFORCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(TRI_BUILDING_LIBRARY) && (defined(__GNUC__) || defined(__clang__))
#define TRI_API __attribute__((visibility("default")))
#else
#define TRI_API
#endif

// ---- version ----

#define TRI_VERSION_MAJOR 0
#define TRI_VERSION_MINOR 1
#define TRI_VERSION_PATCH 0
#define TRI_VERSION_STRING "0.1.0"

// The library's version string, e.g. "0.1.0"; static storage.
TRI_API const char *tri_version(void);

// ---- status and errors ----

typedef enum tri_status {
    TRI_STATUS_OK = 0,
    TRI_STATUS_INVALID_ARGUMENT = -1,  // a caller's argument is out of range or NULL
    TRI_STATUS_IO = -2,                // open, read, mmap or stat failed
    TRI_STATUS_BAD_FORMAT = -3,        // a file breaks the rules of its format
    TRI_STATUS_UNSUPPORTED = -4,       // valid input that this runtime does not handle (a dtype)
    TRI_STATUS_OUT_OF_MEMORY = -5,     // host allocation failed
    TRI_STATUS_DEVICE = -6,            // a GPU call failed
    TRI_STATUS_DEVICE_OUT_OF_MEMORY = -7,
    TRI_STATUS_NOT_FOUND = -8,         // a named key, tensor or file does not exist
    TRI_STATUS_INTERNAL = -9,          // a bug in the runtime
} tri_status;

// A short constant description of a status, e.g. "bad format"; static storage.
TRI_API const char *tri_status_str(tri_status status);

// The message of the last failing call on this thread, or "" if none failed. Owned by the library,
// valid until the next failing call on the same thread.
TRI_API const char *tri_last_error(void);

// ---- logging ----

typedef enum tri_log_level {
    TRI_LOG_LEVEL_ERROR = 0,
    TRI_LOG_LEVEL_WARN = 1,
    TRI_LOG_LEVEL_INFO = 2,
    TRI_LOG_LEVEL_DEBUG = 3,
} tri_log_level;

// msg is one line without a trailing newline, valid only during the call.
typedef void (*tri_log_fn)(tri_log_level level, const char *msg, void *user);

// Sets the process-wide log callback. fn == NULL restores the default, which writes messages at
// or above max_level to stderr. Messages above max_level are never formatted.
TRI_API void tri_log_set(tri_log_fn fn, void *user, tri_log_level max_level);

// ---- tensors and models ----

typedef enum tri_dtype {
    TRI_DTYPE_F32 = 0,
    TRI_DTYPE_F16 = 1,
    TRI_DTYPE_BF16 = 2,
    TRI_DTYPE_Q8_0 = 3,  // blocks of 32: f16 scale + 32 x int8
    TRI_DTYPE_Q4_0 = 4,  // blocks of 32: f16 scale + 16 bytes of 4-bit values, offset 8
    TRI_DTYPE_Q4_1 = 5,  // blocks of 32: f16 scale + f16 min + 16 bytes of 4-bit values
    TRI_DTYPE_COUNT
} tri_dtype;

// "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", or "?"; static storage.
TRI_API const char *tri_dtype_name(tri_dtype type);

typedef enum tri_file_format {
    TRI_FILE_FORMAT_GGUF = 0,
    TRI_FILE_FORMAT_SAFETENSORS = 1,  // single file or sharded, with config.json beside it
} tri_file_format;

// How the two halves of a rotated pair are laid out inside one head of Q and K.
typedef enum tri_rope_layout {
    TRI_ROPE_LAYOUT_ADJACENT = 0,  // element 2i pairs with 2i + 1 (llama GGUF files)
    TRI_ROPE_LAYOUT_HALF = 1,      // element i pairs with i + head_dim / 2 (HF checkpoints)
} tri_rope_layout;

typedef enum tri_rope_scaling {
    TRI_ROPE_SCALING_NONE = 0,
    TRI_ROPE_SCALING_LINEAR = 1,   // positions divided by factor
    TRI_ROPE_SCALING_DYNAMIC = 2,  // dynamic NTK: base grows once the sequence passes orig_ctx
    TRI_ROPE_SCALING_YARN = 3,     // YaRN: per-frequency ramp between beta_fast and beta_slow
    TRI_ROPE_SCALING_LLAMA3 = 4,   // Llama-3.1: low/high frequency factors
} tri_rope_scaling;

typedef enum tri_tokenizer_kind {
    TRI_TOKENIZER_NONE = 0,  // the model carries no tokenizer
    TRI_TOKENIZER_SPM = 1,   // SentencePiece BPE with byte fallback (Llama-2 family)
    TRI_TOKENIZER_BPE = 2,   // byte-level BPE (GPT-2 style: SmolLM2, Llama-3)
} tri_tokenizer_kind;

// The architecture of a Llama-family model, as read from the file.
typedef struct tri_model_config {
    int32_t n_vocab;
    int32_t n_embd;       // hidden size
    int32_t n_ff;         // feed-forward (intermediate) size
    int32_t n_layer;
    int32_t n_head;       // query heads
    int32_t n_head_kv;    // key/value heads; == n_head for MHA, fewer for GQA
    int32_t head_dim;     // usually n_embd / n_head
    int32_t n_ctx_train;  // max positions the model was trained for (after any rope scaling)
    float rms_eps;
    float rope_theta;     // rope frequency base
    bool tied_embeddings; // the output projection is the token embedding
    tri_rope_layout rope_layout;
    tri_rope_scaling rope_scaling;
    float rope_factor;          // scaling factor; 1 for none
    int32_t rope_orig_ctx;      // context before scaling (YaRN, dynamic, Llama-3); 0 if unknown
    float yarn_beta_fast;       // YaRN ramp bounds, in rotations over orig_ctx (32 and 1 by default)
    float yarn_beta_slow;
    float yarn_mscale;          // YaRN attention factor on cos/sin; 0 = 0.1 ln(factor) + 1
    float llama3_low_freq_factor;
    float llama3_high_freq_factor;
    bool has_rope_freqs;        // per-dimension frequency divisors come from a tensor (GGUF)
} tri_model_config;

typedef struct tri_model_info {
    tri_file_format format;
    const char *architecture;   // "llama"; owned by the model
    const char *name;           // general.name or the directory name; owned by the model, may be ""
    tri_model_config config;
    tri_tokenizer_kind tokenizer;
    int64_t n_tensors;
    uint64_t n_bytes;           // bytes of tensor data in all files
    int32_t n_files;            // 1, or the number of shards
    int64_t n_params;           // elements in all tensors
} tri_model_info;

typedef struct tri_tensor_info {
    const char *name;  // owned by the model
    tri_dtype type;
    int32_t n_dims;
    int64_t shape[4];  // outermost first, as safetensors and PyTorch write it: (rows, cols) for a matrix
    uint64_t n_bytes;
} tri_tensor_info;

typedef struct tri_model_params {
    // Touch every page of the weights at load time (MAP_POPULATE) so that the first tokens do not
    // pay for page faults. false: pages are read on first use.
    bool populate;
    // Called during loading with a fraction in [0, 1]; return false to cancel the load, which then
    // fails with TRI_STATUS_INVALID_ARGUMENT. NULL: no progress reports.
    bool (*progress)(float fraction, void *user);
    void *progress_user;
} tri_model_params;

typedef struct tri_model tri_model;

TRI_API tri_model_params tri_model_default_params(void);

// Opens a model: a .gguf file, a .safetensors file, a directory with config.json and
// model.safetensors or model.safetensors.index.json, or such an index file itself. On success
// *out_model owns the mapped files; free it with tri_model_free() after every object made from it.
// params may be NULL for the defaults.
TRI_API tri_status tri_model_load(const char *path, const tri_model_params *params,
                                  tri_model **out_model);
TRI_API void tri_model_free(tri_model *model);

// Fills *out with a description of the model; its strings live as long as the model.
TRI_API void tri_model_get_info(const tri_model *model, tri_model_info *out);

// Describes tensor i, 0 <= i < n_tensors, in file order; TRI_STATUS_NOT_FOUND past the end.
TRI_API tri_status tri_model_tensor_info(const tri_model *model, int64_t i, tri_tensor_info *out);

// ---- sampling ----

typedef struct tri_sampler_params {
    float temperature;  // logits are divided by it; <= 0: greedy (argmax, lowest id on ties)
    int32_t top_k;      // keep only the k most likely tokens; 0: keep all
    float top_p;        // then keep the smallest set of most likely tokens with this much mass,
                        // in (0, 1]; 1: keep all
    uint64_t seed;      // the random stream; the same seed gives the same tokens
} tri_sampler_params;

// temperature 0 (greedy), top_k 0, top_p 1, seed 0.
TRI_API tri_sampler_params tri_sampler_default_params(void);

// ---- sessions: a model, a backend and a KV cache ----

typedef struct tri_session tri_session;

// Which past tokens each layer and KV head attends to (docs/kv-policies.md). Every policy keeps
// the keys and values of all n_ctx positions, so rollback is exact; they differ in the view.
typedef enum tri_kv_policy {
    TRI_KV_POLICY_FULL = 0,       // every past token
    TRI_KV_POLICY_STREAMING = 1,  // StreamingLLM: kv_sink first tokens + the most recent ones, keys
                                  // rotated by their position inside the cache (runs past n_ctx_train)
    TRI_KV_POLICY_H2O = 2,        // H2O: heavy hitters by accumulated attention + recent tokens,
                                  // per KV head
    TRI_KV_POLICY_RETRIEVAL = 3,  // TriForce: top-k chunks of kv_chunk tokens by query . mean key,
                                  // per layer and KV head, + the tokens since the last selection
} tri_kv_policy;

typedef struct tri_session_params {
    int32_t n_ctx;      // positions the KV cache holds (prompt + generated tokens);
                        // 0: the model's trained context, at most 8192
    int32_t n_threads;  // CPU worker threads; 0: one per core
    int32_t n_batch;    // tokens per step of a long prefill; 0: 128
    tri_dtype kv_type;  // TRI_DTYPE_F16 (the default) or TRI_DTYPE_F32
    // ---- KV policy (ignored for TRI_KV_POLICY_FULL) ----
    tri_kv_policy kv_policy;  // default TRI_KV_POLICY_FULL
    int32_t kv_budget;        // past tokens a step attends to besides its own (and, for retrieval,
                              // those since the last selection); 1 <= budget <= n_ctx; 0: 4096 or
                              // n_ctx if smaller
    int32_t kv_chunk;         // retrieval: tokens per chunk, divides kv_budget; 0: 8
    int32_t kv_sink;          // streaming: attention-sink tokens, < kv_budget; 0: 16 (TriForce's draft
                              // cache), or kv_budget / 2 for budgets under 32
    int32_t kv_refresh;       // retrieval: re-select after this many tokens since the last selection;
                              // 0: only after a prompt's prefill (tri_generate) and on request
} tri_session_params;

TRI_API tri_session_params tri_session_default_params(void);

// Creates a session on model: allocates the KV cache and work buffers. The model must outlive the
// session. params may be NULL for the defaults. Free with tri_session_free().
TRI_API tri_status tri_session_create(const tri_model *model, const tri_session_params *params,
                                      tri_session **out_session);
TRI_API void tri_session_free(tri_session *session);

// Runs n tokens (ids in [0, n_vocab)) after the ones already in the cache. Afterwards the logits
// of the last token, or of every token when all_logits is set, can be read with
// tri_session_logits(). Fails with INVALID_ARGUMENT, leaving the cache unchanged, if they do not
// fit the context.
TRI_API tri_status tri_session_eval(tri_session *session, const int32_t *tokens, int32_t n,
                                    bool all_logits);

// Row i (n_vocab floats) of the last tri_session_eval's logits: i in [0, n) when it asked for all
// logits, and i == -1 for the last token in either case; NULL otherwise. Valid until the next
// call that changes the session.
TRI_API const float *tri_session_logits(const tri_session *session, int32_t i);

// Tokens in the cache.
TRI_API int32_t tri_session_n_past(const tri_session *session);
TRI_API int32_t tri_session_n_ctx(const tri_session *session);

// Rolls the cache back to its first n_past tokens (0 <= n_past <= tri_session_n_past). Running
// tokens afterwards gives the same logits as if the dropped tokens had never been run.
TRI_API tri_status tri_session_truncate(tri_session *session, int32_t n_past);

// Empties the cache.
TRI_API void tri_session_reset(tri_session *session);

// Retrieval policy: re-select the chunks at the end of the next tri_session_eval, from the query
// of its last token (call it before the last piece of a prompt, or when drafts are accepted less
// often). A no-op for the other policies.
TRI_API void tri_session_kv_refresh(tri_session *session);

// Seeds the session's random stream (tri_generate seeds it from its sampler params).
TRI_API void tri_session_seed(tri_session *session, uint64_t seed);

// Draws a token from the last token's logits with params (NULL: greedy).
TRI_API tri_status tri_session_sample(tri_session *session, const tri_sampler_params *params,
                                      int32_t *out_token);

// ---- generation ----

// Called with each generated token as soon as it is chosen; return false to stop.
typedef bool (*tri_token_fn)(int32_t token, void *user);
// Called during a prompt's prefill with tokens done and total; return false to cancel.
typedef bool (*tri_progress_fn)(int64_t done, int64_t total, void *user);

typedef struct tri_generate_params {
    int32_t n_predict;          // tokens to generate at most; 0: until the context is full
    tri_sampler_params sampler;
    bool stop_at_eos;           // stop after the model's end-of-sequence token; default true
    tri_progress_fn on_prefill; // NULL: no progress reports
    void *user;                 // passed to on_prefill
} tri_generate_params;

typedef struct tri_generate_stats {
    int32_t n_prompt;        // tokens prefilled
    int32_t n_generated;     // tokens generated (including an end-of-sequence token)
    double prefill_seconds;
    double decode_seconds;   // from the first generated token to the last
} tri_generate_stats;

TRI_API tri_generate_params tri_generate_default_params(void);

// Appends prompt (n_prompt tokens, may be 0 to continue) to the session and generates after it,
// calling on_token for each token. stats may be NULL. Cancelling through a callback is not an
// error: the function returns TRI_STATUS_OK with what was generated so far.
TRI_API tri_status tri_generate(tri_session *session, const int32_t *prompt, int32_t n_prompt,
                                const tri_generate_params *params, tri_token_fn on_token, void *user,
                                tri_generate_stats *stats);

#ifdef __cplusplus
}
#endif

#endif  // TRIFORCE_H
