/*
 * triforce.h - the public API of the offloading runtime.
 *
 * This header is the whole published interface: if a symbol does not appear here, it is not part
 * of the API and may change without notice.
 *
 * Conventions
 *   - Every handle is opaque and comes with a create/free pair; free(NULL) is a no-op. A create
 *     that fails leaves its out-pointer NULL.
 *   - A NULL handle or a NULL required pointer is refused, never dereferenced: a function returning
 *     a tri_status fails with TRI_STATUS_INVALID_ARGUMENT, one returning a count returns 0 (-1
 *     for token ids), a string or pointer NULL ("" for tri_last_error), a bool false, and a void
 *     function does nothing (tests/test-api-misuse.c calls each). A handle used after its free is
 *     undefined behaviour, as with free() itself: telling a freed handle from a live one would
 *     need a registry of live handles consulted on every call, hot paths included.
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

// ---- system: GPUs and host ----

// One CUDA device as the runtime sees it.
typedef struct tri_device_info {
    char name[256];           // e.g. "NVIDIA GeForce RTX 4090"
    char pci_bus_id[32];      // "0000:01:00.0" (domain:bus:device.function), "" if unknown
    uint64_t total_bytes;     // device memory
    uint64_t free_bytes;      // free at the time of the call
    int32_t cc_major;         // compute capability, e.g. 8.9
    int32_t cc_minor;
    int32_t sm_count;         // streaming multiprocessors
    int32_t pcie_gen;         // current PCIe generation (1-6; an idle GPU drops to a lower one), 0 unknown
    int32_t pcie_width;       // current PCIe lanes, 0 unknown
    int32_t pcie_max_gen;     // generation and lanes the link can run at, 0 unknown
    int32_t pcie_max_width;
} tri_device_info;

// Number of CUDA devices usable by this process; 0 without a GPU, without a driver, or when the
// library was built without CUDA (see tri_host_info.cuda_support).
TRI_API int32_t tri_device_count(void);

// Describes device 0 <= device < tri_device_count(). TRI_STATUS_DEVICE if it cannot be queried.
TRI_API tri_status tri_device_get_info(int32_t device, tri_device_info *out);

// Measures host-to-device bandwidth: the best of a few copies of bytes (0: 256 MiB) of pinned
// host memory to the device on the transfer stream the offload engine uses, in GB/s (1e9 bytes).
// Takes about a tenth of a second. TRI_STATUS_DEVICE without such a device (or CUDA support).
TRI_API tri_status tri_device_measure_h2d(int32_t device, uint64_t bytes, double *gbps);

// The host: CPU, memory, and what this build supports.
typedef struct tri_host_info {
    char cpu_name[256];        // "model name" of /proc/cpuinfo, "" if unknown
    int32_t n_cpus;            // logical CPUs online
    uint64_t total_bytes;      // physical memory
    uint64_t available_bytes;  // memory available to new allocations (MemAvailable), 0 unknown
    const char *simd;          // SIMD level the CPU backend uses: "avx512", "avx2", "scalar"; static
    bool cuda_support;         // the library was built with the CUDA backend
} tri_host_info;

// Describes the host; fails only if out is NULL.
TRI_API tri_status tri_host_get_info(tri_host_info *out);

// The CUDA backend in one line: what it was built for when it is usable ("CUDA runtime 13.0, SASS
// sm_80 sm_86 sm_89 sm_90 sm_120, PTX compute_120"), else why there is no device ("no NVIDIA
// driver (no /dev/nvidiactl)", "the NVIDIA driver supports CUDA 12.2, older than this build's
// CUDA runtime 13.0: update the driver", "this build has no CUDA support"). The CUDA backend is
// a module the library loads on first use (libtriforce-cuda.so, installed in libdir/triforce/);
// this call loads it if that has not been tried yet. Static string, valid until exit.
TRI_API const char *tri_cuda_status(void);

// ---- tensors and models ----

typedef enum tri_dtype {
    TRI_DTYPE_F32 = 0,
    TRI_DTYPE_F16 = 1,
    TRI_DTYPE_BF16 = 2,
    TRI_DTYPE_Q8_0 = 3,  // blocks of 32: f16 scale + 32 x int8
    TRI_DTYPE_Q4_0 = 4,  // blocks of 32: f16 scale + 16 bytes of 4-bit values, offset 8
    TRI_DTYPE_Q4_1 = 5,  // blocks of 32: f16 scale + f16 min + 16 bytes of 4-bit values
    TRI_DTYPE_Q5_0 = 6,  // blocks of 32: f16 scale + 32 high bits + 16 bytes of low nibbles, offset 16
    TRI_DTYPE_Q5_1 = 7,  // blocks of 32: f16 scale + f16 min + 32 high bits + 16 bytes of low nibbles
    // GGML's "K-quants": super-blocks of 256 with an f16 scale (and f16 minimum) for the whole
    // super-block and quantized scales for each 16 or 32 of its elements
    TRI_DTYPE_Q2_K = 8,   // 2.625 bits per weight: 2-bit values, 4-bit scales and minima per 16
    TRI_DTYPE_Q3_K = 9,   // 3.4375 bits: 3-bit values, 6-bit scales per 16
    TRI_DTYPE_Q4_K = 10,  // 4.5 bits: 4-bit values, 6-bit scales and minima per 32
    TRI_DTYPE_Q5_K = 11,  // 5.5 bits: 5-bit values, 6-bit scales and minima per 32
    TRI_DTYPE_Q6_K = 12,  // 6.5625 bits: 6-bit values, 8-bit scales per 16
    TRI_DTYPE_IQ4_NL = 13, // blocks of 32: f16 scale + 16 bytes of 4-bit indices into a fixed table
                           // of 16 non-uniform levels
    TRI_DTYPE_IQ4_XS = 14, // 4.25 bits: super-blocks of 256, IQ4_NL's 16 levels with a 6-bit scale per 32
    TRI_DTYPE_COUNT,
    // Not a tensor type: a KV cache of two precisions (tri_session_params.kv_type, --kv-type
    // mixed, after MiKV): the attention sinks and the recent window in f16, every row in q4_0
    TRI_DTYPE_KV_MIXED = 64
} tri_dtype;

// "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_K", "q3_K", "q4_K", "q5_K",
// "q6_K", "iq4_nl", "iq4_xs" (GGML's names), "mixed" (TRI_DTYPE_KV_MIXED), or "?"; static storage.
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
    TRI_ROPE_SCALING_LONGROPE = 5, // Phi-3 LongRoPE ("longrope", "su"): per-pair divisors, the short
                                   // ones up to orig_ctx, the long ones past it (per forward call)
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
    int32_t rope_orig_ctx;      // context before scaling (YaRN, dynamic, Llama-3); 0 if unknown.
                                // (dynamic NTK from config.json: n_ctx_train, as in transformers)
    float yarn_beta_fast;       // YaRN ramp bounds, in rotations over orig_ctx (32 and 1 by default)
    float yarn_beta_slow;
    float yarn_mscale;          // YaRN attention factor on cos/sin; 0 = 0.1 ln(factor) + 1
    float llama3_low_freq_factor;
    float llama3_high_freq_factor;
    bool has_rope_freqs;        // per-dimension frequency divisors come from a tensor (GGUF)
    int32_t sliding_window;     // a query at position p sees keys at p - sliding_window + 1 .. p
                                // (Mistral, Phi-3); 0: every earlier key
    float rope_attn_factor;     // LONGROPE: multiplies cos and sin, sqrt(1 + ln(s) / ln(orig_ctx))
                                // for s = n_ctx_train / orig_ctx > 1; 0 stands for 1
} tri_model_config;

typedef struct tri_model_info {
    tri_file_format format;
    const char *architecture;   // the family: "llama", "qwen2", "mistral", "phi3", "gemma"; owned by
                                // the model
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

// Measures how fast this machine's host threads attend to KV where it lies (the host half of an
// offloaded layer split between PCIe and the host, tri_session_params.kv_host_fraction): KV bytes
// (K and V, f16) read per second, in GB/s, by n_queries queries of config's heads over 16,384 rows
// of one layer, with n_threads threads (0: as the session's default), best of three. Takes a
// fraction of a second to a few seconds; needs no device. The figure tri_plan_params.host_attn_gbps
// wants at the pass's query count.
TRI_API tri_status tri_measure_host_attention(const tri_model_config *config, int32_t n_queries, int32_t n_threads,
                                              double *gbps);

// Describes tensor i, 0 <= i < n_tensors, in file order; TRI_STATUS_NOT_FOUND past the end.
TRI_API tri_status tri_model_tensor_info(const tri_model *model, int64_t i, tri_tensor_info *out);

// ---- sampling ----

typedef struct tri_sampler_params {
    float temperature;  // logits are divided by it; <= 0: greedy (argmax, lowest id on ties)
    int32_t top_k;      // keep only the k most likely tokens; 0: keep all
    float top_p;        // then keep the smallest set of most likely tokens with this much mass
                        // (of what top_k kept), in [0, 1]; 1 or 0: keep all
    uint64_t seed;      // the random stream: generation seeds it at the first call after the
                        // session (or engine) was created or reset and whenever the seed differs
                        // from the last call's, and otherwise continues it, so the same seed and
                        // calls from a reset give the same tokens, and a generation continued
                        // over several calls never reuses numbers. TRI_SEED_RANDOM: a seed
                        // drawn from the operating system's entropy (getrandom) at that seeding
    // ---- filters and penalties (appended after the fields above) ----
    //
    // Order, as HF transformers' generate applies its processors and warpers: the penalties on the
    // raw logits, then temperature, top_k, top_p, min_p. The penalties look at the last
    // penalty_last_n tokens of the context before the token being drawn (prompt included, as
    // llama.cpp does); for a token seen c > 0 times there:
    //   logit = logit > 0 ? logit / repeat_penalty : logit * repeat_penalty   (HF, CTRL)
    //   logit -= c * frequency_penalty + presence_penalty                     (OpenAI, llama.cpp)
    // They apply at temperature 0 too (greedy then takes the argmax of the penalised logits).
    // Speculative decoding stays exact: every level's distribution at a position is transformed by
    // the same function of the context before it (docs/speculative.md).
    float min_p;              // then drop tokens less likely than min_p times the most likely one,
                              // in [0, 1]; 0: keep all
    float repeat_penalty;     // > 1 makes repeated tokens less likely, in [0, 100]; 1 or 0: off
    float presence_penalty;   // subtracted once from a repeated token's logit (OpenAI's
                              // presence_penalty), in [-100, 100]; 0: off
    float frequency_penalty;  // subtracted per occurrence (OpenAI's frequency_penalty), in
                              // [-100, 100]; 0: off
    int32_t penalty_last_n;   // tokens of context the penalties look at; 0: 64 (llama.cpp's
                              // default); -1: the whole context
} tri_sampler_params;

// tri_sampler_params.seed: draw the seed from the system's entropy (different text every run).
#define TRI_SEED_RANDOM UINT64_MAX

// temperature 0 (greedy), top_k 0, top_p 1, seed 0, min_p 0, repeat_penalty 1, presence_penalty 0,
// frequency_penalty 0, penalty_last_n 0 (64): plain greedy decoding.
TRI_API tri_sampler_params tri_sampler_default_params(void);

// The common chat settings: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05 (llama.cpp's),
// repeat_penalty 1.1 over the last 64 tokens (Ollama's; without it small models fall into loops),
// seed TRI_SEED_RANDOM. What `offload-run chat`, `serve` and `generate --chat` use unless told
// otherwise.
TRI_API tri_sampler_params tri_sampler_chat_params(void);

// Checks params: INVALID_ARGUMENT naming the field for a NaN or infinity, top_k < 0,
// top_p or min_p outside [0, 1], repeat_penalty outside [0, 100], presence or frequency penalty
// outside [-100, 100], penalty_last_n < -1. tri_generate, tri_generate_spec and tri_session_sample
// refuse such params the same way.
TRI_API tri_status tri_sampler_params_check(const tri_sampler_params *params);

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

// Where the retrieval policy looks up the chunks whose summaries best match a query
// (docs/kv-policies.md). EXACT and FAISS_FLAT select the same chunks (ties by the earlier chunk),
// so they give bit-identical logits; IVF is approximate by design. The FAISS kinds need a build
// with FAISS (UNSUPPORTED otherwise).
typedef enum tri_kv_index {
    TRI_KV_INDEX_EXACT = 0,       // a scan of every chunk summary (OpenMP over many)
    TRI_KV_INDEX_FAISS_FLAT = 1,  // FAISS inner-product flat index, rescored exactly
    TRI_KV_INDEX_FAISS_IVF = 2,   // FAISS IVF (64 lists, 8 probed) once it holds enough chunks,
                                  // flat until then: for contexts of a million tokens
} tri_kv_index;

// Where a session computes (tri_session_params.device_kind).
typedef enum tri_device_kind {
    TRI_DEVICE_AUTO = 0,  // the first CUDA device when one is usable, else the CPU
    TRI_DEVICE_CPU = 1,   // the CPU backend, the reference
    TRI_DEVICE_CUDA = 2,  // CUDA device tri_session_params.device; TRI_STATUS_DEVICE without one
} tri_device_kind;

// Parses one device name as --device and tri_session_params.devices spell it: "cpu", "cuda"
// (device 0) or "cuda:N", into *kind (TRI_DEVICE_CPU or TRI_DEVICE_CUDA) and *index.
// INVALID_ARGUMENT naming the text for anything else (a list, an unknown kind, a bad index). A
// CUDA index that does not exist is found when the device opens (TRI_STATUS_DEVICE).
TRI_API tri_status tri_device_parse(const char *name, tri_device_kind *kind, int32_t *index);

typedef struct tri_session_params {
    int32_t n_ctx;      // positions the KV cache holds (prompt + generated tokens); 0: the
                        // model's trained context (n_ctx_train; 8192 when the file does not
                        // say). Past n_ctx_train the session is made, with a warning logged:
                        // the model was not trained for positions there. The cache is allocated
                        // for all n_ctx: a 128K model's trained context is a large cache
    int32_t n_threads;  // CPU threads one op uses at most, the caller's included, taken from the
                        // process-wide pool (one thread per CPU the caller may run on); 0: all
    int32_t n_batch;    // tokens per step of a long prefill; 0: 128 (a STREAMING cache steps one
                        // token at a time past its window, so batching never changes its contents)
    tri_dtype kv_type;  // TRI_DTYPE_F16 (the default), TRI_DTYPE_F32, or TRI_DTYPE_Q8_0 /
                        // TRI_DTYPE_Q4_0: GGML's blocks of 32 values of a (layer, KV head,
                        // position) row, read in place by the attention; the output is then
                        // exactly that of the model with a q8_0 / q4_0-rounded cache, not the f16
                        // one's. Quantized types need head_dim a multiple of 32, the full cache
                        // policy (offloaded or not) and autoregressive decoding (not tri_spec),
                        // on the CPU or CUDA backend: elsewhere the session is refused, naming kv_type
    // ---- KV policy (ignored for TRI_KV_POLICY_FULL) ----
    tri_kv_policy kv_policy;  // default TRI_KV_POLICY_FULL
    int32_t kv_budget;        // past tokens a step attends to besides its own (and, for retrieval,
                              // those since the last selection); >= 1; 0: 4096, rounded down to
                              // whole chunks for retrieval; when n_ctx is no longer than the
                              // budget, nothing is evicted: the session runs as FULL. Streaming and
                              // h2o hold only the budget's rows (plus a step's and a rollback's:
                              // docs/kv-policies.md), whatever n_ctx, which then only caps the
                              // length of the stream
    int32_t kv_chunk;         // retrieval: tokens per chunk, divides kv_budget; 0: 8
    int32_t kv_sink;          // streaming: attention-sink tokens, < kv_budget; 0: 16 (TriForce's draft
                              // cache), or kv_budget / 2 for budgets under 32
    int32_t kv_refresh;       // retrieval: re-select after this many tokens since the last selection
                              // (counted from the first one, made after the prompt: a prompt is never
                              // cut); 0: only after a prompt's prefill (tri_generate) and on request
    tri_kv_index kv_index;    // retrieval (and L2 of tri_spec_create): the chunk index; 0: EXACT
    // ---- device ----
    tri_device_kind device_kind;  // default TRI_DEVICE_AUTO. On a device the model's weights are
                                  // copied into its memory once per session (per engine for
                                  // tri_spec_create), so the device must hold them with the caches
    int32_t device;               // TRI_DEVICE_CUDA: device index in [0, tri_device_count());
                                  // ignored otherwise
    int32_t kv_layers_offloaded;  // layers (the last ones) whose full KV cache lives in host
                                  // memory and streams through two device buffers per pass,
                                  // overlapped with compute (docs/offload.md); 0: none. FULL policy
                                  // only; at most the model's layer count
    int32_t weight_layers_streamed; // layers (the last ones) whose weights stay in host memory and
                                  // stream through two device buffers per pass, overlapped with
                                  // compute (docs/offload.md); 0: every layer resident. Ignored on
                                  // the CPU, whose memory is the host's
    int32_t weight_layers_from_disk; // layers (the last ones of the streamed) whose weights are not
                                  // held in host memory but read from the model file each pass,
                                  // two blocks ahead, through three pinned staging slots
                                  // (docs/offload.md); 0: none. At most weight_layers_streamed; a
                                  // model in one file only (a sharded checkpoint is UNSUPPORTED).
                                  // Ignored on the CPU
    double kv_host_fraction;      // of each offloaded layer's rows (kv_layers_offloaded), the
                                  // fraction attended by host threads where they lie while the rest
                                  // streams and is attended on the device, in steps of up to 32
                                  // tokens (docs/offload.md, "Attending where the KV lives"); in
                                  // [0, 1], 0: every row streams. Same results (bit for bit on the CPU)
    int32_t kv_host_threads;      // threads of that host attention; 0: the cores of the device's
                                  // NUMA node less one
    const char *devices;          // tensor parallelism: a device list, "cuda:0,cuda:1" or
                                  // "cpu:0,cpu:1" (up to 8, one kind; docs/offload.md): the model's
                                  // KV heads, attention and FFN split over them, two all-reduces per
                                  // layer through host memory. One entry ("cuda:1", "cpu") names a
                                  // single device. NULL or "": device_kind and device. Copied at
                                  // create; INVALID_ARGUMENT for duplicates, unknown kinds, a missing
                                  // index or more devices than KV heads, TRI_STATUS_DEVICE for a
                                  // CUDA device that does not exist
    int32_t kv_mixed_heavy;       // kv_type mixed: per layer and KV head, positions past the recent
                                  // window kept in f16 as well by the attention they received (MiKV's
                                  // heavy hitters by H2O's scores, docs/kv-policies.md); 0: none.
                                  // No rollback, no kv_host_fraction, no speculative target
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

// Where the session computes: "cpu" or "cuda:N". Valid while the session lives.
TRI_API const char *tri_session_device(const tri_session *session);

// Tokens in the cache.
TRI_API int32_t tri_session_n_past(const tri_session *session);
TRI_API int32_t tri_session_n_ctx(const tri_session *session);

// Rolls the cache back to its first n_past tokens (0 <= n_past <= tri_session_n_past). Running
// tokens afterwards gives the same logits as if the dropped tokens had never been run.
TRI_API tri_status tri_session_truncate(tri_session *session, int32_t n_past);

// Empties the cache; the next tri_generate seeds the random stream afresh (tri_sampler_params).
TRI_API void tri_session_reset(tri_session *session);

// Retrieval policy: re-select the chunks at the end of the next tri_session_eval, from the query
// of its last token (call it before the last piece of a prompt, or when drafts are accepted less
// often). A no-op for the other policies.
TRI_API void tri_session_kv_refresh(tri_session *session);

// What a session's KV cache policy is and has done, for a closing report.
typedef struct tri_kv_info {
    tri_kv_policy policy;  // in effect: a budget that covers the whole context makes it FULL
    int32_t n_past;        // positions in the cache now
    int32_t n_ctx;         // its capacity
    int32_t budget;        // past tokens kept (STREAMING, H2O, RETRIEVAL); 0 for FULL
    int32_t chunk;         // RETRIEVAL: tokens per chunk (budget / chunk chunks kept); else 0
    int32_t sink;          // STREAMING: attention sinks; else 0
    int32_t refresh;       // RETRIEVAL: tokens between selections; 0: only after a prompt
    int64_t n_selections;  // RETRIEVAL: chunk selections made since create or reset
    int32_t selected_at;   // RETRIEVAL: cache length at the last selection; -1: none yet or another policy
} tri_kv_info;

// Fills *out; INVALID_ARGUMENT for NULL.
TRI_API tri_status tri_session_kv_info(const tri_session *session, tri_kv_info *out);

// Seeds the session's random stream. tri_generate seeds it from its sampler params at its first
// call after create or reset and when the seed changes, and otherwise continues it; a stream
// seeded here with that same seed is continued.
TRI_API void tri_session_seed(tri_session *session, uint64_t seed);

// Draws a token from the last token's logits with params (NULL: greedy); the penalties look at
// the tokens in the cache (those run with tri_session_eval and generated, after any truncate).
TRI_API tri_status tri_session_sample(tri_session *session, const tri_sampler_params *params,
                                      int32_t *out_token);

// Evaluates tokens[i] (n_tokens[i] >= 1 of them, ids in [0, n_vocab)) on sessions[i] for every
// i < n_sessions, as tri_session_eval(sessions[i], tokens[i], n_tokens[i], false) would, in shared
// forward passes: the rows of all sessions are concatenated for every matmul, so each weight is
// read once per pass whatever the batch, while each session keeps its own cache (any policy,
// offloaded or not), positions and causal mask and attends only to its own rows (several prompts
// in one pass: block-diagonal attention, no padding). Afterwards each session's last token's
// logits are readable with tri_session_logits(sessions[i], -1). On the CPU backend each session's
// logits and cache are bit-identical to evaluating it alone (docs/api.md, "Batches"). The
// sessions must be distinct, share one model and compute on the same device (or device list);
// INVALID_ARGUMENT names the session and the problem otherwise, or a batch that does not fit a
// session's context, before any session changes. The pass computes with the first session's
// weights on its device (tensor parallelism: the same device list for all, each rank its share);
// each session's cache stays its own. On a failure in a pass every session is rolled back to
// where it was (its last logits gone). Not to be called while any of them generates.
TRI_API tri_status tri_session_eval_batch(tri_session *const *sessions, const int32_t *const *tokens,
                                          const int32_t *n_tokens, int32_t n_sessions);

// tri_session_eval_batch keeping more than the last row of logits: the last n_rows[i] tokens' rows
// of session i (1 <= n_rows[i] <= n_tokens[i]; NULL: 1 each), e.g. a verification's draft of
// gamma tokens after its catch-up tokens (n_rows gamma + 1), or every token's (n_tokens[i]).
// Afterwards tri_session_logits(sessions[i], j) reads row j in [0, n_rows[i]): the logits after
// token n_tokens[i] - n_rows[i] + j (-1: the last). Bit-identical on the CPU backend to
// tri_session_eval(..., true)'s rows for the same tokens; the rows not kept go through no output
// head. Errors as tri_session_eval_batch, and INVALID_ARGUMENT for an n_rows outside its range.
TRI_API tri_status tri_session_eval_batch_rows(tri_session *const *sessions, const int32_t *const *tokens,
                                               const int32_t *n_tokens, const int32_t *n_rows, int32_t n_sessions);

// Plans one pass of a continuous batch, as DeepSpeed-FastGen's Dynamic SplitFuse does: n_left[i]
// is what sequence i still has to run before it samples (1 for a decoding sequence, the rest of
// its prompt while it prefills, 0 for an idle one). Every decoding sequence gets its token, so
// decoding never waits for a prefill; the rest of budget tokens is shared among the prefilling
// sequences in equal parts (what a shorter prompt leaves goes to the others), so a long prompt
// runs in chunks beside the others' decode steps and a short one that arrives meanwhile starts at
// once instead of waiting for the long one's whole prefill. Writes n_take[i] in [0, n_left[i]],
// the tokens of sequence i for this pass (tri_session_eval_batch over those with n_take[i] > 0),
// and returns their sum: budget, or less when less is left, or more when more sequences decode
// than budget holds (each still gets its token). -1 for NULL arrays, n < 0, a negative n_left or
// budget < 1.
TRI_API int32_t tri_batch_plan(const int32_t *n_left, int32_t n, int32_t budget, int32_t *n_take);

// ---- prompt cache: a session's KV on disk (docs/formats.md, "Prompt cache") ----

// What a save or a load did.
typedef struct tri_prompt_cache_stats {
    int32_t n_tokens;  // tokens written, or reused by a load (now in the session)
    int32_t n_file;    // tokens the file holds
    bool logits;       // the last token's logits were written, or came back with a load
    uint64_t bytes;    // bytes written or read (the header region and padding included)
    double seconds;    // wall time of the I/O, checksums included (a save: until the data is on disk)
    double gbps;       // bytes / seconds / 1e9
    bool uring;        // io_uring did the I/O (false: pread / pwrite)
    bool direct;       // O_DIRECT: the disk's speed, not the page cache's
    bool damaged;      // a load: a block of the file failed its checksum, and only the blocks before it
                       // were used (n_tokens counts them); the file is worth writing again
} tri_prompt_cache_stats;

// Writes the session's cache to path (replacing it atomically: a temporary file renamed at the
// end): the tokens it holds, tokens[0 .. n_tokens) (the ids run into it, in order: the session
// does not keep them; n_tokens must be tri_session_n_past), their keys and values for every layer
// (an offloaded layer's from host memory, where they live), the last token's logits when the last
// call left them (after a prefill: tri_generate_params.on_prefill at done == total is the moment),
// and the model's identity (docs/formats.md). The FULL policy's cache, offloaded or not, and the
// RETRIEVAL policy's (which holds every row too): UNSUPPORTED for STREAMING and H2O (their views
// depend on what ran, not only on the rows), for kv_type mixed (its f16 rows are not in the
// format) and for a session over several devices. INVALID_ARGUMENT, nothing written, when path
// holds something other than a prompt cache (tri_prompt_cache_writable). stats may be NULL.
TRI_API tri_status tri_session_save_prompt(tri_session *session, const char *path, const int32_t *tokens,
                                           int32_t n_tokens, tri_prompt_cache_stats *stats);

// Empties the session, then fills it from path with the longest common prefix of the file's
// tokens and tokens[0 .. n_tokens) (the prompt about to be run): afterwards the session holds
// stats->n_tokens of them, and the caller runs tokens[stats->n_tokens .. n_tokens) (with
// tri_generate), which gives exactly what running the whole prompt would. When the file holds
// exactly these tokens with their logits, all n_tokens are reused and the logits restored
// (tri_generate with no prompt continues); otherwise at most n_tokens - 1, so that the last runs.
// A RETRIEVAL session gets its chunk summaries made from the loaded rows and no selection: at most
// n_tokens - kv queries (16) are reused, so that the selection after the prompt reads the queries
// of its last tokens as a full prefill's does.
// Refused, the session left empty (run the whole prompt): NOT_FOUND when the file does not
// exist; INVALID_ARGUMENT when it was written for another model (its identity: config, tensor
// table, the start of every tensor's data) or another shape or KV type, or, for a length-dependent rope
// scaling (dynamic NTK, LongRoPE), by a session whose first evaluation's length gives other rotary
// tables than n_tokens does (docs/formats.md); after a load the rope takes n_tokens as that length,
// as a fresh run of the prompt would; BAD_FORMAT for a file that is not a prompt
// cache, is truncated, or whose header, token table or first block fails its checksum (a later
// block that fails keeps the blocks before it: OK, fewer tokens reused, stats->damaged set);
// UNSUPPORTED as for tri_session_save_prompt. The
// message (tri_last_error) names the file and the reason. stats may be NULL.
TRI_API tri_status tri_session_load_prompt(tri_session *session, const char *path, const int32_t *tokens,
                                           int32_t n_tokens, tri_prompt_cache_stats *stats);

// The token ids a prompt cache file holds (header and region checked, the rows not read), in a
// malloc'ed array the caller frees: what an application that keeps several contexts (a server's
// slots) compares with a prompt before choosing to load. Says nothing of whether the file fits a
// session (tri_session_load_prompt checks that). NOT_FOUND, IO, BAD_FORMAT as that function.
TRI_API tri_status tri_prompt_cache_tokens(const char *path, int32_t **tokens, int32_t *n_tokens);

// Whether tri_session_save_prompt may write path: OK when it does not exist, is an empty file, or
// starts with a prompt cache's header (its magic, size and checksum: a cache of any version, stale
// or damaged after the header); INVALID_ARGUMENT, the message naming the file and what it is,
// otherwise (a document given as the cache's path by mistake is never overwritten: the save
// refuses it the same way); IO when it cannot be read. An application checks at start with it.
TRI_API tri_status tri_prompt_cache_writable(const char *path);

// ---- applications: threads, aborting, why a generation stopped ----
//
// CPU threads: every CPU backend of the process (each session's, each tri_spec engine's) runs its
// parallel work on one shared pool per set of CPUs: the CPUs the thread that first computes may
// run on (its affinity mask; the whole machine unless the application or a device's NUMA binding
// restricted it), one thread per CPU. Sessions computing at the same time on different threads
// take turns op by op, each op on the whole pool, so N sessions never start N threads per core;
// the pool's threads stop when the last backend that used it is freed. tri_session_params.n_threads
// caps how many of the pool's threads one session's ops use. docs/api.md, "Threads".

// Why a generation call stopped (tri_generate_stats.stop_reason, tri_spec_stats.stop_reason).
typedef enum tri_stop_reason {
    TRI_STOP_NONE = 0,      // no generation ran (a call refused before starting sets ERROR)
    TRI_STOP_EOS = 1,       // the model's end-of-sequence token, or one of the call's stop_tokens
                            // (an end of turn): emitted, counted in n_generated
    TRI_STOP_LENGTH = 2,    // n_predict tokens were generated
    TRI_STOP_CONTEXT = 3,   // the context is full
    TRI_STOP_CALLBACK = 4,  // on_token or on_prefill returned false
    TRI_STOP_ABORT = 5,     // tri_session_abort / tri_spec_abort from another thread
    TRI_STOP_ERROR = 6,     // the call failed: its tri_status and tri_last_error() say why
    TRI_STOP_STRING = 7,    // the text reached one of the call's stop strings
} tri_stop_reason;

// "none", "eos", "length", "context", "callback", "abort", "error", "stop_string", or "?"; static
// storage.
TRI_API const char *tri_stop_reason_str(tri_stop_reason reason);

// Asks the tri_generate call running on session to stop: it returns TRI_STATUS_OK with what it
// generated so far, the stats' stop_reason TRI_STOP_ABORT, after the token (or prefill piece of
// n_batch tokens) in progress; the session stays usable, as after a callback's stop. Safe to call
// at any time from any thread, and from a signal handler (one lock-free atomic operation); the
// session must be alive. Returns true when a generation was running and will stop; false when
// none is running (nothing is remembered for a later call: an application that may ask to stop
// before its generation has started also returns false from its on_token callback).
TRI_API bool tri_session_abort(tri_session *session);

typedef struct tri_spec tri_spec;  // the speculative engine (below, "Speculative decoding")
// The same for a tri_generate_spec call running on spec: it stops after the round in progress (or
// prefill piece).
TRI_API bool tri_spec_abort(tri_spec *spec);

// ---- generation ----

// Called with each generated token as soon as it is chosen; return false to stop.
typedef bool (*tri_token_fn)(int32_t token, void *user);
// Called with generated text (len bytes of UTF-8, NUL-terminated; valid during the call);
// return false to stop.
typedef bool (*tri_text_fn)(const char *text, size_t len, void *user);
// Called during a prompt's prefill with tokens done and total; return false to cancel.
typedef bool (*tri_progress_fn)(int64_t done, int64_t total, void *user);

typedef struct tri_generate_params {
    int32_t n_predict;          // tokens to generate at most; 0: until the context is full
    tri_sampler_params sampler;
    bool stop_at_eos;           // stop after the model's end-of-sequence token; default true
    tri_progress_fn on_prefill; // NULL: no progress reports; called after each piece of n_batch
                                // tokens, or of 8,192 where offloaded KV layers or streamed
                                // weights make the prefill layer-major (docs/offload.md)
    void *user;                 // passed to on_prefill
    // ---- text and stop strings (appended after the fields above) ----
    const char *const *stop;    // n_stop strings (NUL-terminated, not empty): generation ends as
                                // soon as the decoded text (special tokens not rendered) contains
                                // one, wherever the token boundaries fall; on_text never sees it
                                // or anything after it; NULL / 0: none
    int32_t n_stop;
    const int32_t *stop_tokens; // n_stop_tokens ids that end generation as EOS does (the model's
                                // end-of-turn tokens: tri_chat_stop_tokens), even when stop_at_eos
                                // is false; the token is emitted (on_token, counted), its text is
                                // not; NULL / 0: none
    int32_t n_stop_tokens;
    tri_text_fn on_text;        // the generated text, decoded (special tokens not rendered),
                                // called whenever some is final. Text that could be the start of a
                                // stop string is held back until the next tokens decide: it comes
                                // out once they do not complete one, or at the end of the call
                                // unless a stop string claims it. Return false to stop. NULL:
                                // none. Stop strings and on_text work with tri_generate and
                                // tri_generate_spec alike and need the model's tokenizer
    void *text_user;            // passed to on_text
} tri_generate_params;

typedef struct tri_generate_stats {
    int32_t n_prompt;        // tokens prefilled
    int32_t n_generated;     // tokens generated (including an end-of-sequence token)
    double prefill_seconds;
    double decode_seconds;   // from the first generated token to the last
    uint64_t kv_bytes_up;    // offloaded KV (kv_layers_offloaded) copied host -> device while
                             // decoding (after the prefill), and new rows copied back; 0
                             // without offloaded layers
    uint64_t kv_bytes_down;
    uint64_t kv_bytes_host;  // offloaded KV rows read in place by the host's attention while
                             // decoding (kv_host_fraction); 0 when nothing is split
    tri_stop_reason stop_reason;  // why the call stopped
} tri_generate_stats;

TRI_API tri_generate_params tri_generate_default_params(void);

// Appends prompt (n_prompt tokens, may be 0 to continue) to the session and generates after it,
// calling on_token for each token. The last token a call emits is not run until it is needed: the
// next tri_generate runs it before its prompt, so a continuation sees everything emitted
// (tri_session_eval, truncate and reset drop it: a caller running the cache by hand decides). The random stream is seeded from params->sampler.seed at the
// first call after create or tri_session_reset and whenever the seed differs from the last
// call's; a call with the same seed continues it, so generating n tokens in one call or in
// several gives the same tokens. stats may be NULL. Cancelling through a callback is not an
// error: the function returns TRI_STATUS_OK with what was generated so far.
TRI_API tri_status tri_generate(tri_session *session, const int32_t *prompt, int32_t n_prompt,
                                const tri_generate_params *params, tri_token_fn on_token, void *user,
                                tri_generate_stats *stats);

// ---- tokenizer ----
//
// Text is UTF-8. Bytes that are not valid UTF-8 are not refused: each is encoded as a byte of its
// own (byte-level BPE, or SentencePiece <0xXX> byte fallback), so tri_detokenize gives them back
// unchanged; see docs/tokenizers.md. Every function here fails with TRI_STATUS_NOT_FOUND when the
// model carries no tokenizer.

// Number of tokens in the model's vocabulary, 0 when it has no tokenizer.
TRI_API int32_t tri_token_count(const tri_model *model);
// Beginning- and end-of-sequence ids, -1 when the model has none.
TRI_API int32_t tri_token_bos(const tri_model *model);
TRI_API int32_t tri_token_eos(const tri_model *model);
// True for control tokens (<s>, <|im_end|>), unknown and unused ids: text that
// tri_detokenize skips unless asked to render special tokens. False for invalid ids.
TRI_API bool tri_token_is_special(const tri_model *model, int32_t id);

// The vocabulary text of a token as the model stores it ("▁the", "Ġthe", "<0x0A>"), in *text and
// *len (not NUL-terminated; owned by the model). INVALID_ARGUMENT for an id out of range.
TRI_API tri_status tri_token_text(const tri_model *model, int32_t id, const char **text,
                                  size_t *len);
// The bytes a token decodes to on its own ("▁the" and "Ġthe" -> " the", "<0x0A>" -> "\n", a
// special token its text), in *text and *len (not NUL-terminated; owned by the model): what
// tri_detokenize writes for it with render_special, except that a leading space is always kept
// (tri_detokenize removes the one SentencePiece puts in front of the text). INVALID_ARGUMENT for
// an id out of range.
TRI_API tri_status tri_token_piece(const tri_model *model, int32_t id, const char **text,
                                   size_t *len);

// Encodes len bytes of text. add_special: add BOS/EOS as the model's tokenizer metadata says
// (SentencePiece models: BOS; SmolLM2: none). parse_special: control-token strings in the text
// such as "<|im_start|>" (and, from a GGUF or tokenizer.model, the unknown token "<unk>", as in
// llama.cpp) become their ids; when false they are tokenized as plain text.
// On return *n_out holds the number of ids the text needs. ids may be NULL when cap == 0: a size
// query that succeeds. With 0 < cap < *n_out nothing useful is written and the call fails with
// TRI_STATUS_INVALID_ARGUMENT.
TRI_API tri_status tri_tokenize(const tri_model *model, const char *text, size_t len,
                                bool add_special, bool parse_special, int32_t *ids, int64_t cap,
                                int64_t *n_out);

// Decodes n ids to UTF-8 in buf: *n_out bytes followed by a NUL, so cap must be at least
// *n_out + 1. buf may be NULL when cap == 0 (a size query). Special tokens are skipped unless
// render_special. The space SentencePiece puts in front of the text is removed. Invalid ids fail
// with INVALID_ARGUMENT, as does a buffer that is too small (with *n_out still set).
TRI_API tri_status tri_detokenize(const tri_model *model, const int32_t *ids, int64_t n,
                                  bool render_special, char *buf, size_t cap, size_t *n_out);

// Streaming detokenizer for printing tokens as they are generated: each push returns only
// complete UTF-8 characters, holding back the bytes of a character split across tokens until its
// last byte arrives; bytes that can never form a character come out as U+FFFD.
typedef struct tri_detokenizer tri_detokenizer;

// The detokenizer must not outlive model; free it with tri_detokenizer_free().
TRI_API tri_status tri_detokenizer_create(const tri_model *model, bool render_special,
                                          tri_detokenizer **out);
// Adds one token; *text/*len receive the text now ready (possibly empty), owned by d and valid
// until the next call on d. NUL-terminated.
TRI_API tri_status tri_detokenizer_push(tri_detokenizer *d, int32_t id, const char **text,
                                        size_t *len);
// Ends the stream: bytes still held back come out as U+FFFD. d can then be reused.
TRI_API tri_status tri_detokenizer_flush(tri_detokenizer *d, const char **text, size_t *len);
TRI_API void tri_detokenizer_free(tri_detokenizer *d);

// ---- speculative decoding ----
// Lossless hierarchical speculative decoding (TriForce, arXiv 2404.11912): a drafter (L1) proposes
// tokens, the target over a retrieval cache (L2) verifies them, and the target over the full cache
// (L3) verifies what L2 accepted, gamma2 tokens in one pass. Every level accepts a token x with
// probability min(1, p(x) / q(x)) and otherwise draws from norm(max(0, p - q)), so the output has
// exactly the target's distribution under the sampler params, and greedy output equals plain
// greedy decoding token for token. docs/speculative.md gives the algorithm and the argument.

typedef enum tri_spec_mode {
    TRI_SPEC_MODE_NONE = 0,       // plain decoding with the target over its full cache
    TRI_SPEC_MODE_DRAFT = 1,      // L1 drafter -> target over the full cache
    TRI_SPEC_MODE_RETRIEVAL = 2,  // target over the retrieval cache -> target over the full cache
    TRI_SPEC_MODE_TRIFORCE = 3,   // L1 -> retrieval -> full: the whole hierarchy
} tri_spec_mode;

typedef enum tri_spec_drafter {
    TRI_SPEC_DRAFTER_MODEL = 0,   // a separate small model with the target's vocabulary
    TRI_SPEC_DRAFTER_LAYERS = 1,  // self-draft: the target running only some of its layers
    TRI_SPEC_DRAFTER_NGRAM = 2,   // prompt lookup: what followed the last n-gram earlier on
} tri_spec_drafter;

typedef struct tri_spec_params {
    tri_spec_mode mode;             // default TRI_SPEC_MODE_TRIFORCE
    tri_spec_drafter drafter;       // what L1 is in DRAFT and TRIFORCE modes; default MODEL
    const tri_model *draft_model;   // DRAFTER_MODEL: not owned, must outlive the handle; its
                                    // vocabulary must be the target's (checked at create)
    const int32_t *draft_layers;    // DRAFTER_LAYERS: target layer indices, strictly increasing;
                                    // copied at create
    int32_t n_draft_layers;
    int32_t ngram_n;                // DRAFTER_NGRAM: longest n-gram looked up (shorter ones are
                                    // tried after it, down to 1); 0: 3
    int32_t gamma1;                 // tokens L1 drafts per L2 verification (TRIFORCE); 0: 2
    int32_t gamma2;                 // tokens the full-cache target verifies per pass (every mode
                                    // but NONE); 0: 6
    int32_t budget;                 // retrieval cache size in tokens, a multiple of chunk (past
                                    // n_ctx: the full cache); 0: 4096 in whole chunks, or, when the
                                    // context is no longer, the full cache (L2 then computes what
                                    // L3 does)
    int32_t chunk;                  // retrieval chunk size in tokens; 0: 8
    // ---- cache policies of the levels (appended after the fields above) ----
    int32_t draft_window;           // L1's StreamingLLM cache: sink + recent tokens it attends
                                    // to, <= n_ctx (n_ctx: nothing is evicted); 0: 256
                                    // (TriForce's draft cache), or the full cache when the
                                    // context is no longer
    int32_t draft_sink;             // L1's attention-sink tokens, < draft_window; 0: 16, or
                                    // draft_window / 2 for windows under 32
    int32_t refresh;                // L2 selects its chunks afresh once this many tokens came
                                    // since its last selection; 0: not by count (it always
                                    // selects after each prompt's prefill)
    float refresh_accept;           // L2 also selects afresh when L3 accepted less than this
                                    // share of L2's tokens over the last 4 L3 passes since its
                                    // last selection; 0: never; default 0.5
    tri_dtype draft_kv_type;        // the draft caches' type: L1's cache (its StreamingLLM or
                                    // full cache) and L2's gathered chunks (its ring of recent
                                    // tokens keeps kv_type): F16, F32, Q8_0 or Q4_0;
                                    // TRI_DTYPE_COUNT (the default): Q8_0 on the CPU and CUDA over an F16
                                    // session (head_dims multiples of 32), else kv_type. L3
                                    // verifies every token, so a quantized draft cache changes
                                    // acceptance, never the output; a budget left to 0 then holds
                                    // the bytes of 4096 f16 tokens. Q8_0 / Q4_0 need head_dim a
                                    // multiple of 32 and the CPU or CUDA; refused naming
                                    // draft_kv_type otherwise
    int32_t tree_nodes;             // L3 verifies a token tree of up to this many drafted tokens
                                    // in one pass: the chain of gamma2 (fewer when tree_nodes is
                                    // smaller) plus siblings at each depth, the drafting level's
                                    // next most likely tokens, as many per depth as the acceptance
                                    // measured by depth and rank makes worth it; exact for every
                                    // sampler (docs/speculative.md, "Token trees"). 0: the chain
                                    // alone. Not in NONE mode; the n-gram drafter proposes no
                                    // siblings. At most 1024
} tri_spec_params;

// Figures of one tri_generate_spec call. Acceptance rates are accepted / proposed.
typedef struct tri_spec_stats {
    int32_t n_prompt;         // tokens prefilled
    int32_t n_generated;      // tokens emitted
    int64_t l1_proposed;      // tokens L1 drafted and handed up (to L2 in TRIFORCE, else to L3)
    int64_t l1_accepted;      // of those, accepted by the level above
    int64_t l2_proposed;      // tokens handed to L3 by L2 (RETRIEVAL, TRIFORCE)
    int64_t l2_accepted;      // of those, accepted by L3
    int64_t n_l2_verify;      // L2 verification passes (TRIFORCE)
    int64_t n_l3_verify;      // L3 passes during decoding; n_generated / n_l3_verify = tokens
                              // emitted per L3 verification
    double l1_seconds;        // wall time in L1 (drafting forwards, or n-gram lookups)
    double l2_seconds;        // in L2 forward passes
    double l3_seconds;        // in L3 forward passes, prefill excluded
    double prefill_seconds;   // prefilling every level
    double decode_seconds;    // from the first generated token to the last
    int64_t n_l2_refresh;     // L2 chunk selections made (after the prefill, by count, by
                              // falling acceptance)
    uint64_t kv_bytes_up;     // while decoding: offloaded KV (kv_layers_offloaded) copied host ->
                              // device (L3's passes, L2's reads of it before a selection, its gathers)
    uint64_t kv_bytes_down;   // and new rows copied back; 0 without offload
    uint64_t kv_bytes_host;   // while decoding: L3's offloaded KV read in place by the host's
                              // attention (kv_host_fraction); 0 when nothing is split
    tri_stop_reason stop_reason;  // why the call stopped
    int64_t n_l3_tree_nodes;  // drafted tokens L3's tree passes verified (chains and siblings,
                              // tree_nodes); 0 without trees
    int64_t n_batch_passes;   // in a speculative batch (tri_spec_batch): the batched passes that ran
                              // this generation's passes (of every level, prefill included); 0 alone
    int64_t n_batch_sequences;  // the sequences those passes carried, this one included (their mean:
                                // n_batch_sequences / n_batch_passes)
} tri_spec_stats;

// mode TRIFORCE, drafter MODEL with no model, ngram_n 3, gamma1 2, gamma2 6, budget 0 (the
// default), chunk 8, draft_window 0 (the default), draft_sink 0 (the default), refresh 0,
// refresh_accept 0.5.
TRI_API tri_spec_params tri_spec_default_params(void);

// Creates the levels the mode needs over target (and params->draft_model): their caches, buffers
// and one CPU backend. session_params (NULL: defaults) sizes every level's context, batch and KV
// type as for a session, and its kv_index is L2's chunk index (its other kv_ fields are plain
// decoding's and are ignored). INVALID_ARGUMENT when the draft model's vocabulary or tokenizer differs
// from the target's, a layer list is bad, or a gamma is negative. target must outlive the handle;
// free it with tri_spec_free().
TRI_API tri_status tri_spec_create(const tri_model *target, const tri_session_params *session_params,
                                   const tri_spec_params *params, tri_spec **out_spec);
TRI_API void tri_spec_free(tri_spec *spec);

// Where the engine computes, every level on one backend: "cpu" or "cuda:N".
TRI_API const char *tri_spec_device(const tri_spec *spec);

// Forgets every token: the next tri_generate_spec starts from an empty context and seeds the
// random stream afresh.
TRI_API void tri_spec_reset(tri_spec *spec);

// Tokens in the context (prompt and emitted tokens).
TRI_API int32_t tri_spec_n_past(const tri_spec *spec);

// Rolls the context back to its first n_past tokens (0 <= n_past <= tri_spec_n_past), e.g. to
// generate again after the same prompt without prefilling it again.
TRI_API tri_status tri_spec_truncate(tri_spec *spec, int32_t n_past);

// As tri_generate, with speculation: appends prompt (may be 0 tokens to continue) and generates
// after it, calling on_token for each emitted token in order. The random stream is seeded from
// params->sampler.seed at the first call after create or tri_spec_reset and whenever the seed
// differs from the last call's; a call with the same seed continues it (tri_spec_truncate does
// not restart it). stats may be NULL. Cancelling through a callback is not an error.
TRI_API tri_status tri_generate_spec(tri_spec *spec, const int32_t *prompt, int32_t n_prompt,
                                     const tri_generate_params *params, tri_token_fn on_token,
                                     void *user, tri_spec_stats *stats);

// ---- speculative decoding in batches (docs/api.md, "Speculative batches") ----
//
// Several engines (one per sequence: its own levels, caches, acceptance, rollbacks and sampler)
// generate together: each level's forward passes of all the sequences that are at that level run
// in one batched pass (tri_session_eval_batch's), so the weights of a level are read once per pass
// whatever the number of sequences. L1 drafts run before L2's and L3's passes, and L2's and L3's
// (the same target weights) share passes, so that the sequences gather at L3's verification. On
// the CPU backend each sequence's output is token for token the one tri_generate_spec gives it
// alone (greedy: plain greedy decoding; sampled: the same draws from its own seeded stream). The
// engines must compute on the same device for their passes to be shared; those split over several
// devices (tensor parallelism) run their passes alone (still correct).

typedef struct tri_spec_batch tri_spec_batch;

TRI_API tri_status tri_spec_batch_create(tri_spec_batch **out);
// Stops the generations still running (as tri_spec_abort: at their next round), waits for them,
// and frees the batch; the engines stay the caller's. NULL is a no-op.
TRI_API void tri_spec_batch_free(tri_spec_batch *batch);

// Starts a generation on spec, as tri_generate_spec(spec, prompt, n_prompt, params, on_token,
// user, stats) would, that advances only in tri_spec_batch_step; it joins the batch's passes from
// the next step (continuous batching: a generation may join between any two steps). prompt,
// params' pointers, user and stats must stay valid until the generation is done; spec must not be
// used elsewhere until then. on_token runs on a thread of the batch's, never two at once, only
// inside tri_spec_batch_step. *out_id (may be NULL): the generation's index for
// tri_spec_batch_result. INVALID_ARGUMENT when spec generates already (in this batch or elsewhere).
TRI_API tri_status tri_spec_batch_add(tri_spec_batch *batch, tri_spec *spec, const int32_t *prompt, int32_t n_prompt,
                                      const tri_generate_params *params, tri_token_fn on_token, void *user,
                                      tri_spec_stats *stats, int32_t *out_id);

// One step: every running generation runs (its acceptance, sampling, callbacks) up to its next
// forward pass; then the passes of the lowest level posted (L1 before L2 before L3), together
// with every other posted pass over the same weights, run as one batched pass. *n_running (may be
// NULL): generations not done yet. A failed pass fails the generations it carried, not the step.
TRI_API tri_status tri_spec_batch_step(tri_spec_batch *batch, int32_t *n_running);

// Whether generation id is done, and its status (its message as the last error when it failed,
// which this call then returns too).
TRI_API tri_status tri_spec_batch_result(const tri_spec_batch *batch, int32_t id, bool *done, tri_status *status);

// All at once: sequence i generates on specs[i] (distinct engines) after prompts[i] (n_prompts[i]
// tokens) with params[i] (params NULL: defaults), on_token(token, users[i]) (users may be NULL),
// its figures in stats[i] and status in statuses[i] (both may be NULL), until every sequence is
// done. Returns the first failure (the message names the sequence), else OK.
TRI_API tri_status tri_generate_spec_batch(tri_spec *const *specs, const int32_t *const *prompts,
                                           const int32_t *n_prompts, const tri_generate_params *params,
                                           tri_token_fn on_token, void *const *users, tri_spec_stats *stats,
                                           tri_status *statuses, int32_t n);

// ---- placement planning for offloaded decoding ----
//
// Pure computation, no GPU needed: from a model's shapes, a context length, device and host
// memory budgets and bandwidths, decide which layers' weights stay on the GPU(s), which stream
// from pinned host memory or from the model file, how many layers keep their full KV cache on the
// GPU (`on_chip`), the buffer and retrieval cache sizes, and predict the time of one TriForce
// round and per emitted token. docs/offload.md describes the model and its assumptions.

typedef enum tri_plan_mode {
    TRI_PLAN_MODE_TRIFORCE = 0,       // L1 draft + L2 retrieval cache + L3 full cache (offloaded)
    TRI_PLAN_MODE_AUTOREGRESSIVE = 1, // plain decoding over the offloaded cache: no draft, no
                                      // retrieval cache, one token per pass
} tri_plan_mode;

// The shapes and stored sizes the planner needs.
typedef struct tri_plan_model {
    tri_model_config config;  // n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab,
                              // tied_embeddings are used
    uint64_t layer_bytes;     // bytes of one transformer block's weights as stored (the largest
                              // block); 0: computed from config and weight_type
    uint64_t other_bytes;     // token embedding, output norm and output head; 0: computed
    tri_dtype weight_type;    // type of the weight matrices, for the computed sizes (norms f32)
} tri_plan_model;

// The shapes of config with weights of weight_type (any tri_dtype; a quantized matrix whose rows
// are not whole blocks, 32 elements or 256 for the K-quants, counts 0 bytes), sizes left 0
// (computed).
TRI_API tri_plan_model tri_plan_model_from_config(const tri_model_config *config,
                                                  tri_dtype weight_type);
// The shapes of a loaded model with the stored sizes of its tensors.
TRI_API void tri_plan_model_from_model(const tri_model *model, tri_plan_model *out);
// The shapes of an HF config.json (path: the file) without its weights, which are taken to be of
// the config's torch_dtype (float32, bfloat16; float16 when absent): for planning a model before
// downloading it. The config is checked as tri_model_load checks it; BAD_FORMAT or UNSUPPORTED
// naming the file and key otherwise.
TRI_API tri_status tri_plan_model_from_config_file(const char *path, tri_plan_model *out);

typedef struct tri_plan_params {
    tri_plan_mode mode;
    int32_t n_ctx;               // tokens of context to plan for (prompt + generated); 0: the
                                 // model's n_ctx_train
    int32_t n_gpu;               // GPUs, tensor parallel (heads split as TriForce's offloading
                                 // code does), each with its own PCIe link; 0: 1
    uint64_t gpu_mem_bytes;      // device memory budget per GPU (--gpu-mem); 0: 24 GiB
    uint64_t gpu_reserve_bytes;  // per GPU, kept out of the plan for the CUDA context, cuBLAS
                                 // workspace and fragmentation; default 1 GiB; 0: none
    uint64_t host_mem_bytes;     // pinned host memory budget (--host-mem); 0: unlimited
    double pcie_gbps;            // host-to-device GB/s (1e9 bytes) per GPU; 0: 25
    double disk_gbps;            // model file read GB/s (O_DIRECT); 0: 3
    double gpu_mem_gbps;         // device memory GB/s per GPU; 0: 1008 (RTX 4090)
    double gpu_tflops;           // sustained f16 TFLOPS per GPU; 0: 80
    double layer_overhead_us;    // fixed cost per layer and forward pass (launches, sync) in us;
                                 // default 20; 0: none
    tri_dtype kv_type;           // F16 (default), F32, Q8_0, Q4_0 (34 or 18 bytes per 32 values:
                                 // every level's cache, host memory and PCIe bytes counted so) or
                                 // KV_MIXED (q4_0's bytes plus f16 sinks and window: kv_sink below)
    // TriForce levels (ignored in AUTOREGRESSIVE mode)
    int32_t retrieval_budget;    // tokens of the L2 retrieval cache; 0: 8192 on one GPU, 12288 on
                                 // two or more (the paper's offloading settings)
    int32_t chunk_size;          // tokens per retrieval chunk; 0: 8
    int32_t gamma1;              // L1 drafts per L2 verification; 0: 2
    int32_t gamma2;              // L2 tokens per L3 verification; 0: 12
    double accept_l1;            // probability that L2 accepts an L1 token; 0: 0.7 (assumed)
    double accept_l2;            // probability that L3 accepts an L2 token; 0: 0.9 (assumed)
    uint64_t draft_bytes;        // L1 draft model weights; 0: 136 MB (llama-68m in f16)
    int32_t draft_n_layer;       // its layers; 0: 2
    double host_attn_gbps;       // KV GB/s (1e9 bytes, K and V) the host's attention reads where the
                                 // offloaded KV lies, at the query count of a pass over it
                                 // (gamma2 + 1 for TriForce's L3, 1 autoregressive); with it each
                                 // offloaded layer is split so that its streamed part and its host
                                 // part take the same time (docs/offload.md); 0: every offloaded
                                 // row streams (TriForce's way)
    double host_dram_gbps;       // host memory GB/s that the split's host reads and every GPU's DMA
                                 // share (a layer takes at least its streamed plus host-read bytes
                                 // over it); 0: not limited
    int32_t tree_nodes;          // TriForce: L3 verifies a token tree of this many nodes drafted by
                                 // L2 in one pass (tree_nodes + 1 rows), the best tree of that size
                                 // under the acceptance by depth and sibling rank; 0: a chain of
                                 // gamma2 (docs/offload.md, "Token trees in the planner")
    double accept_rank_decay;    // acceptance of L2's sibling of rank r >= 2 (given the ranks before
                                 // it rejected) is accept_l2 x decay^(r - 1) (assumed); 0: 0.5
    // kv_type TRI_DTYPE_KV_MIXED: every row q4_0 (stored and streamed as q4_0's), and the sinks and
    // the recent window also in f16, resident on every GPU for every layer with a ring of 2 steps
    // of 128 rows (docs/kv-policies.md, "Mixed precision"); ignored for other types
    int32_t kv_sink;             // f16 sink rows; 0: 16
    int32_t kv_window;           // f16 recent rows; 0: 240
    // several sequences decoded together (docs/offload.md, "Batches in the planner"): each
    // with n_ctx tokens of its own KV (on chip or offloaded with the rest), its own retrieval and
    // draft caches; a pass carries every sequence's rows, reads the weights once and streams each
    // sequence's offloaded KV once per layer; the levels step in lockstep (a round drafts until
    // every sequence's L2 holds gamma2 tokens). Times and bytes per token are then per token of
    // the batch (all sequences together); 0: 1
    int32_t n_batch;
} tri_plan_params;

TRI_API tri_plan_params tri_plan_default_params(void);

// A placement and its predicted cost. Bytes "per GPU" are what each of the n_gpu devices holds.
typedef struct tri_plan {
    tri_plan_params params;          // with every default resolved
    tri_plan_model model;            // with the computed sizes filled in
    int32_t n_layer;
    int32_t n_weights_gpu;           // layers whose weights are resident on the GPU(s)
    int32_t n_weights_host;          // layers whose weights stream from pinned host memory
    int32_t n_weights_disk;          // layers whose weights are read from the model file per pass
    int32_t on_chip;                 // first layers whose full KV cache stays on the GPU(s)
    int32_t n_kv_host;               // layers whose KV cache lives in host memory and streams
    int32_t retrieval_budget;        // tokens of the retrieval cache; 0 in AUTOREGRESSIVE mode
    uint64_t kv_layer_bytes;         // K and V of one layer at n_ctx, all GPUs together
    uint64_t weight_layer_bytes;     // one block's weights, all GPUs together
    // device, per GPU
    uint64_t gpu_weight_bytes;       // resident blocks + embedding/head
    uint64_t gpu_kv_bytes;           // KV of the on-chip layers
    uint64_t gpu_kv_buffer_bytes;    // two layers of streamed KV (double buffer); 0 if none stream
    uint64_t gpu_weight_buffer_bytes;// two blocks of streamed weights; 0 if all are resident
    uint64_t gpu_retrieval_bytes;    // retrieval cache (budget + slots for new tokens)
    uint64_t gpu_draft_bytes;        // draft weights and its StreamingLLM cache
    uint64_t gpu_act_bytes;          // activations and logits
    uint64_t gpu_total_bytes;        // all of the above + gpu_reserve_bytes
    // host
    uint64_t host_kv_bytes;          // offloaded KV
    uint64_t host_weight_bytes;      // streamed weights held in pinned memory
    uint64_t host_summary_bytes;     // chunk summaries (mean keys) for retrieval
    uint64_t host_staging_bytes;     // pinned staging buffers for weights read from disk
    uint64_t host_total_bytes;
    // predicted cost, seconds unless said otherwise
    double t_l3;                     // one L3 pass (verification over the full cache)
    double t_l2;                     // one L2 pass (gamma1 + 1 tokens over the retrieval cache)
    double t_l1;                     // one L1 draft token
    double l2_passes;                // expected L2 passes per round
    double l1_passes;                // expected L1 passes per round
    double tokens_per_round;         // expected tokens emitted per L3 pass
    double t_round;
    double t_token;                  // t_round / tokens_per_round
    uint64_t pcie_bytes_l3;          // host-to-device bytes of one L3 pass, all GPUs
    uint64_t pcie_bytes_l2;          // host-to-device bytes of one L2 pass (streamed weights)
    double pcie_bytes_token;         // per emitted token
    double t_token_pcie_floor;       // pcie_bytes_token over the aggregate PCIe bandwidth
    double t_token_ar;               // AUTOREGRESSIVE mode under the same budgets (its own
                                     // placement); equals t_token in that mode
    // attending where the KV lives (params.host_attn_gbps > 0)
    double kv_host_fraction;         // of each offloaded layer's rows, attended on the host (the
                                     // session's kv_host_fraction); 0: all stream
    uint64_t host_kv_read_bytes_l3;  // KV bytes the host's attention reads in one L3 pass
    double host_kv_read_bytes_token; // per emitted token
    double t_token_streamed;         // t_token of the same placement with every offloaded row
                                     // streamed
    // tensor parallelism (n_gpu > 1): the split the engine builds (tri_session_params.devices)
    double t_allreduce_token;        // of t_token, the two all-reduces per layer and pass
    double allreduce_bytes_token;    // bytes each GPU copies down and up for them, per token
    int32_t tp_kv_heads_max;         // the largest share of KV heads one GPU holds
    int32_t tp_ff_rows_max;          // the largest share of FFN rows
    // token trees (params.tree_nodes > 0): the tree L3 verifies
    int32_t l3_rows;          // query rows of one L3 pass: gamma2 + 1, or the tree's nodes + 1
    int32_t tree_nodes_used;  // nodes of the best tree (at most tree_nodes); 0 for a chain
    int32_t tree_depth;       // its depth (the chain L2 drafts along); gamma2 for a chain
    // kv_type mixed: the f16 sinks, window and ring of every layer, per GPU (in gpu_total_bytes);
    // 0 for other types
    uint64_t gpu_kv_f16_bytes;
    // params.n_batch > 1: L2 passes per round over a lone sequence's (>= 1; included in l2_passes),
    // what lockstep drafting costs: a round waits for the sequence that needs the most passes
    double l2_lockstep;
} tri_plan;

// Plans model under params (NULL: defaults). INVALID_ARGUMENT for impossible parameters;
// DEVICE_OUT_OF_MEMORY when the device budget cannot hold what must be on the GPU (the message
// says what and how much); OUT_OF_MEMORY when the host budget cannot hold the offloaded KV cache.
TRI_API tri_status tri_plan_compute(const tri_plan_model *model, const tri_plan_params *params,
                                    tri_plan *out);

// Writes the plan as a human-readable table into buf (cap bytes, NUL-terminated); *n_out (may
// be NULL) receives the length it needs without the NUL. buf may be NULL with cap 0 to ask the
// size; a smaller cap truncates and fails with INVALID_ARGUMENT.
TRI_API tri_status tri_plan_format(const tri_plan *plan, char *buf, size_t cap, size_t *n_out);

// ---- chat templates ----
//
// A conversation is rendered with the model's own chat template (GGUF tokenizer.chat_template, or
// "chat_template" of an HF checkpoint's tokenizer_config.json). Templates are Jinja programs; the
// runtime runs them with its own Jinja interpreter, set up as Hugging Face transformers sets up
// jinja2 (trim_blocks, lstrip_blocks, loop controls, tojson, raise_exception, strftime_now), so
// the text is jinja2's byte for byte (docs/chat-templates.md: what it covers, the templates it
// was checked on, those it refuses). A template the interpreter refuses is rendered, where its
// markers show one, as one of the built-in formats below, in C (docs/formats.md); otherwise it is
// refused (UNSUPPORTED, the message says so) and the caller can name a format.

typedef enum tri_chat_format {
    TRI_CHAT_FORMAT_AUTO = 0,     // recognise the template
    TRI_CHAT_FORMAT_CHATML = 1,   // <|im_start|>role\n...<|im_end|>\n (SmolLM2, Qwen2, OpenHermes)
    TRI_CHAT_FORMAT_LLAMA2 = 2,   // <s>[INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST] ... </s>
    TRI_CHAT_FORMAT_LLAMA3 = 3,   // <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
    TRI_CHAT_FORMAT_MISTRAL = 4,  // <s>[INST] ... [/INST]...</s> (v0.1, v0.2: no system role)
    TRI_CHAT_FORMAT_PHI3 = 5,     // <|user|>\n...<|end|>\n (Phi-3, Phi-3.5)
    TRI_CHAT_FORMAT_GEMMA = 6,    // <start_of_turn>user\n...<end_of_turn>\n (no system role)
    TRI_CHAT_FORMAT_JINJA = 7,    // the template itself, run by the Jinja interpreter (no fallback)
    TRI_CHAT_FORMAT_COUNT
} tri_chat_format;

// One message: role is "system", "user" or "assistant" (other roles are written where the format
// writes roles by name: ChatML, Llama-3); content is UTF-8. Both NUL-terminated, not NULL.
typedef struct tri_chat_message {
    const char *role;
    const char *content;
} tri_chat_message;

// "auto", "chatml", "llama2", "llama3", "mistral", "phi3", "gemma", "jinja"; NULL for other values.
TRI_API const char *tri_chat_format_name(tri_chat_format format);
// The format of one of those names (as --chat-format takes them); INVALID_ARGUMENT otherwise.
TRI_API tri_status tri_chat_format_from_name(const char *name, tri_chat_format *out);

// The built-in format template text (len bytes) writes, recognised by its markers; UNSUPPORTED
// when it is none of them (the interpreter may still run it: tri_chat_render with AUTO).
TRI_API tri_status tri_chat_template_format(const char *tmpl, size_t len, tri_chat_format *out);
// How the model's own template is rendered: JINJA when the interpreter runs it, else the built-in
// format its markers show; NOT_FOUND when the model carries no template, UNSUPPORTED when it is
// neither (the message names the file and says why).
TRI_API tri_status tri_chat_model_format(const tri_model *model, tri_chat_format *out);

// Renders n >= 1 messages with template text tmpl (NUL-terminated; may be NULL when format is
// neither AUTO nor JINJA): AUTO runs it with the interpreter, and when the interpreter refuses it
// (a construct it lacks) renders the built-in format its markers show; JINJA runs it with the
// interpreter only; a named format is rendered as named, with the variant tmpl shows when it is
// of that format, else the format's first published variant. The template sees messages (role,
// content), tools = none, add_generation_prompt, bos_token and eos_token (the texts given; NULL:
// ""), and strftime_now gives the current UTC time. The text goes into buf (cap bytes,
// NUL-terminated when cap > 0; may be NULL with cap 0 to ask the size); *n_out gets its length
// without the NUL. add_generation_prompt ends the text with the header of an assistant turn.
// INVALID_ARGUMENT when the template refuses the conversation (its raise_exception: roles that
// do not alternate, a system message the model does not take; or an error jinja2 would raise),
// or when cap is too small (with *n_out set); BAD_FORMAT when a template runs past the
// interpreter's limits (steps, nesting, 16 MiB of output). The text carries BOS and other
// special tokens as text: tokenize it with parse_special and without add_special.
TRI_API tri_status tri_chat_render(const char *tmpl, tri_chat_format format, const char *bos_token,
                                   const char *eos_token, const tri_chat_message *msgs, size_t n,
                                   bool add_generation_prompt, char *buf, size_t cap, size_t *n_out);

// tri_chat_render with the model's template (format AUTO or JINJA) and its BOS and EOS token
// texts (an HF checkpoint's tokenizer_config.json bos_token and eos_token when it has them).
// With a named format the model needs no template. Errors as tri_chat_model_format and
// tri_chat_render.
TRI_API tri_status tri_chat_apply(const tri_model *model, tri_chat_format format,
                                  const tri_chat_message *msgs, size_t n, bool add_generation_prompt,
                                  char *buf, size_t cap, size_t *n_out);

// tri_chat_apply with the conversation as JSON, for what role and content do not carry:
// messages_json is an array of OpenAI-style message objects (role, content, and whatever else the
// template reads: tool_calls, tool_call_id, name, reasoning_content), given to the template as
// they are; tools_json (NULL: none) an array of tool definitions, the template's tools. With a
// built-in format (named, or AUTO's fallback) only role and content are used, content must be a
// string, and tools are refused (UNSUPPORTED). BAD_FORMAT, naming the field, for JSON that does
// not parse or is not an array of objects with a string role.
TRI_API tri_status tri_chat_apply_json(const tri_model *model, tri_chat_format format,
                                       const char *messages_json, const char *tools_json,
                                       bool add_generation_prompt, char *buf, size_t cap,
                                       size_t *n_out);

// The tokens that end an assistant's turn in the model's vocabulary: EOS and each of <|im_end|>,
// <|eot_id|>, <|eom_id|>, <end_of_turn>, <|end|>, <|endoftext|>, </s>, <|end_of_text|> that is a
// special token of the vocabulary, for tri_generate_params.stop_tokens. Writes at most cap ids
// (ids may be NULL with cap 0) and sets *n_out to the count; NOT_FOUND without a tokenizer.
TRI_API tri_status tri_chat_stop_tokens(const tri_model *model, int32_t *ids, int32_t cap,
                                        int32_t *n_out);

#ifdef __cplusplus
}
#endif

#endif  // TRIFORCE_H
