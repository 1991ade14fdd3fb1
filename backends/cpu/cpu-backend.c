// cpu-backend.c - the CPU backend: the reference implementation of every op in backend.h.
//
// Threads: a persistent pool (cpu-pool.h) over tasks of rows of W (matmul), rows (norms, RoPE)
// and (KV head, query block[, chunk of keys]) tasks (attention); ops too small to pay for waking the
// workers run on the calling thread.
#include <float.h>
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "cpu-kernels.h"
#include "cpu-pool.h"
#include "dtype.h"
#include "error.h"

typedef struct cpu_state {
    tri__cpu_simd simd;
    const tri__cpu_kernels *kr;
    const tri__cpu_kernels *kr_base;  // the level's table; kr is kr_bf16 while bf16 scores are on
    tri__cpu_kernels kr_bf16;         // kr_base with attn_scores_f16 on bf16 operands
    tri__cpu_pool *pool;  // the process-wide pool of the CPUs of the thread that ran the first
                          // parallel op (cpu-pool.h); jobs take up to be->n_threads of its threads
    void *xq;             // quantized activations of the current matmul, see cpu_quantize_x
    size_t xq_bytes;      // allocated in xq
} cpu_state;

static cpu_state *cpu_priv(tri__backend *be) { return be->priv; }

// The CPUs this thread may run on (taskset, a cgroup's cpuset), else every online one.
static int cpu_max_threads(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

// Elements of work below which an op runs on the calling thread: waking the workers costs a few
// microseconds, more when another process holds a core.
#define CPU_MIN_PARALLEL_WORK 32768

// Runs fn(arg, i0, i1) over [0, n) in ranges of at least grain items, on the pool when the whole
// (work elements) is worth it. Returns OUT_OF_MEMORY only if the pool had to be (re)made and
// could not; the work is then done on the calling thread anyway.
typedef void (*cpu_range_fn)(void *arg, int64_t i0, int64_t i1);
typedef struct cpu_range_job {
    cpu_range_fn fn;
    void *arg;
    int64_t n, per;
} cpu_range_job;

static void cpu_range_chunk(void *vj, int64_t c) {
    const cpu_range_job *j = vj;
    int64_t i0 = c * j->per, i1 = i0 + j->per < j->n ? i0 + j->per : j->n;
    j->fn(j->arg, i0, i1);
}

static void cpu_parallel(tri__backend *be, int64_t n, int64_t grain, int64_t work, cpu_range_fn fn, void *arg) {
    cpu_state *st = cpu_priv(be);
    int nt = be->n_threads < 1 ? 1 : be->n_threads;
    if (n <= 0) return;
    if (nt > 1 && work >= CPU_MIN_PARALLEL_WORK && !st->pool) {
        if (tri__cpu_pool_acquire(&st->pool)) st->pool = NULL;  // serial below
    }
    if (nt == 1 || work < CPU_MIN_PARALLEL_WORK || !st->pool) {
        fn(arg, 0, n);
        return;
    }
    // ranges of at least grain items, about 4 per thread for balance
    int64_t per = (n + 4 * nt - 1) / (4 * nt);
    if (per < grain) per = grain;
    cpu_range_job j = {fn, arg, n, per};
    tri__cpu_pool_run_max(st->pool, nt, cpu_range_chunk, &j, (n + per - 1) / per);
}

// ---- SIMD level ----

tri__cpu_simd tri__cpu_simd_detect(void) {
#if TRI_CPU_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return __builtin_cpu_supports("avx512vnni") ? TRI_CPU_SIMD_AVX512_VNNI : TRI_CPU_SIMD_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return TRI_CPU_SIMD_AVX2;
#endif
    return TRI_CPU_SIMD_SCALAR;
}

const char *tri__cpu_simd_name(tri__cpu_simd simd) {
    switch (simd) {
    case TRI_CPU_SIMD_AUTO: return "auto";
    case TRI_CPU_SIMD_SCALAR: return "scalar";
    case TRI_CPU_SIMD_AVX2: return "avx2";
    case TRI_CPU_SIMD_AVX512: return "avx512";
    case TRI_CPU_SIMD_AVX512_VNNI: return "avx512vnni";
    }
    return "?";
}

// ---- memory ----

static tri_status cpu_alloc(tri__backend *be, size_t bytes, void **out) {
    (void)be;
    *out = NULL;
    if (bytes == 0) return TRI_STATUS_OK;
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded < bytes) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "cpu: alloc of %zu bytes", bytes);
    *out = aligned_alloc(64, rounded);
    if (!*out) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "cpu: alloc of %zu bytes", bytes);
    return TRI_STATUS_OK;
}

static void cpu_free(tri__backend *be, void *ptr) {
    (void)be;
    free(ptr);
}

static tri_status cpu_copy(tri__backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memmove(dst, src, bytes);
    return TRI_STATUS_OK;
}

static tri_status cpu_gather(tri__backend *be, void *dst, const void *src, const int64_t *offsets, int64_t n,
                             int64_t row_bytes) {
    (void)be;
    if (n < 0 || row_bytes <= 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cpu gather: %lld rows of %lld bytes", (long long)n,
                         (long long)row_bytes);
    for (int64_t i = 0; i < n; i++) {
        if (offsets[i] < 0)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cpu gather: offset %lld of row %lld",
                             (long long)offsets[i], (long long)i);
        memcpy((char *)dst + i * row_bytes, (const char *)src + offsets[i], (size_t)row_bytes);
    }
    return TRI_STATUS_OK;
}

static tri_status cpu_chunk_mean(tri__backend *be, float *out, const void *x, tri_dtype type, int64_t n_chunks,
                                 int64_t chunk, int64_t width, int64_t stride) {
    (void)be;
    const bool quant = type == TRI_DTYPE_Q8_0 || type == TRI_DTYPE_Q4_0;  // a quantized cache's blocks
    if (type != TRI_DTYPE_F16 && type != TRI_DTYPE_F32 && !quant)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "cpu chunk_mean: %s rows", tri_dtype_name(type));
    if (n_chunks < 0 || chunk <= 0 || width < 0 || stride < width || (quant && stride % TRI_QK != 0))
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cpu chunk_mean: %lld chunks of %lld rows, width %lld, stride %lld",
                         (long long)n_chunks, (long long)chunk, (long long)width, (long long)stride);
    tri__chunk_mean(out, x, type, n_chunks, chunk, width, stride);
    return TRI_STATUS_OK;
}

static tri_status cpu_synchronize(tri__backend *be) {
    (void)be;
    return TRI_STATUS_OK;
}

static void cpu_destroy(tri__backend *be) {
    cpu_state *st = cpu_priv(be);
    tri__cpu_pool_release(st->pool);
    free(st->xq);
    free(st);
    free(be);
}

// ---- conversions ----

// Row r of a (rows, n) table of type t, converted to f32 (n a multiple of t's block when quantized).
static void cpu_row_to_f32(float *out, const void *table, tri_dtype t, int64_t r, int64_t n) {
    const uint8_t *row = (const uint8_t *)table + r * tri__dtype_row_bytes(t, n);
    switch (t) {
    case TRI_DTYPE_F32: memcpy(out, row, sizeof(float) * (size_t)n); break;
    case TRI_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) out[i] = tri__f16_to_f32(((const uint16_t *)row)[i]);
        break;
    case TRI_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) out[i] = tri__bf16_to_f32(((const uint16_t *)row)[i]);
        break;
    case TRI_DTYPE_Q8_0:
        for (int64_t b = 0; b < n / TRI_QK; b++) {
            const tri__block_q8_0 *blk = (const tri__block_q8_0 *)row + b;
            float d = tri__f16_to_f32(blk->d);
            for (int i = 0; i < TRI_QK; i++) out[b * TRI_QK + i] = d * (float)blk->qs[i];
        }
        break;
    case TRI_DTYPE_Q4_0:
        for (int64_t b = 0; b < n / TRI_QK; b++) {
            const tri__block_q4_0 *blk = (const tri__block_q4_0 *)row + b;
            float d = tri__f16_to_f32(blk->d);
            for (int i = 0; i < TRI_QK / 2; i++) {
                out[b * TRI_QK + i] = d * (float)((blk->qs[i] & 0x0f) - 8);
                out[b * TRI_QK + i + TRI_QK / 2] = d * (float)((blk->qs[i] >> 4) - 8);
            }
        }
        break;
    case TRI_DTYPE_Q4_1:
        for (int64_t b = 0; b < n / TRI_QK; b++) {
            const tri__block_q4_1 *blk = (const tri__block_q4_1 *)row + b;
            float d = tri__f16_to_f32(blk->d), mn = tri__f16_to_f32(blk->m);
            for (int i = 0; i < TRI_QK / 2; i++) {
                out[b * TRI_QK + i] = d * (float)(blk->qs[i] & 0x0f) + mn;
                out[b * TRI_QK + i + TRI_QK / 2] = d * (float)(blk->qs[i] >> 4) + mn;
            }
        }
        break;
    default: tri__dequantize_row(out, row, t, n); break;  // the other quantized types
    }
}

static tri_status cpu_get_rows(tri__backend *be, float *out, const void *table, tri_dtype type, int64_t n_rows,
                               int64_t n, const int32_t *ids, int64_t m) {
    (void)be;
    if (tri__dtype_row_bytes(type, n) <= 0 || n_rows < 0 || m < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cpu get_rows: %s rows of %lld elements",
                         tri_dtype_name(type), (long long)n);
    for (int64_t i = 0; i < m; i++)
        if (ids[i] < 0 || ids[i] >= n_rows)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cpu get_rows: id %d at %lld outside [0, %lld)",
                             ids[i], (long long)i, (long long)n_rows);
    for (int64_t i = 0; i < m; i++) cpu_row_to_f32(out + i * n, table, type, ids[i], n);
    return TRI_STATUS_OK;
}

static tri_status cpu_convert(tri__backend *be, void *dst, tri_dtype type, const float *src, int64_t n) {
    (void)be;
    switch (type) {
    case TRI_DTYPE_F32: memmove(dst, src, sizeof(float) * (size_t)n); return TRI_STATUS_OK;
    case TRI_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = tri__f32_to_f16(src[i]);
        return TRI_STATUS_OK;
    case TRI_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = tri__f32_to_bf16(src[i]);
        return TRI_STATUS_OK;
    case TRI_DTYPE_Q8_0:
    case TRI_DTYPE_Q4_0:  // a quantized KV cache's rows: whole blocks of 32
        if (n % TRI_QK != 0)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cpu convert: %lld values to %s, not whole blocks of %d",
                             (long long)n, tri_dtype_name(type), TRI_QK);
        tri__quantize_row(dst, src, type, n);
        return TRI_STATUS_OK;
    default: return tri__fail(TRI_STATUS_UNSUPPORTED, "cpu convert: to %s", tri_dtype_name(type));
    }
}

// ---- matmul ----

// Rows of W per task: enough that a task amortises its scheduling (a multiple of every level's
// tile_n), few enough that the threads balance. Rows of x per pass over the task's rows of W:
// their f32 or quantized copies stay in L2 while the rows of W are reused from L1 by every tile.
#define MATMUL_W_ROWS 16
#define MATMUL_X_ROWS 64

typedef struct quantize_job {
    const tri__cpu_kernels *kr;
    const tri__cpu_xq *xq;
    const float *x;
} quantize_job;

static void quantize_rows(void *arg, int64_t i0, int64_t i1) {
    const quantize_job *j = arg;
    int64_t k = j->xq->k, nb8 = k / TRI_QK * 8;
    for (int64_t i = i0; i < i1; i++)
        j->kr->quantize((int8_t *)j->xq->qs + i * k, (float *)j->xq->d8 + i * nb8, (float *)j->xq->s8 + i * nb8,
                        j->x + i * k, k);
}

// Quantizes x (m, k) into st->xq: (m, k) int8 values, then (m, k / 32, 8) scales and
// (m, k / 32, 8) sums (tri__cpu_xq), each part 64-byte aligned.
static tri_status cpu_quantize_x(tri__backend *be, const float *x, int64_t m, int64_t k, tri__cpu_xq *out) {
    cpu_state *st = cpu_priv(be);
    size_t qbytes = ((size_t)(m * k) + 63) / 64 * 64, sbytes = (size_t)(m * (k / TRI_QK)) * 8 * sizeof(float);
    size_t need = qbytes + 2 * sbytes;
    if (need > st->xq_bytes) {
        free(st->xq);
        st->xq_bytes = 0;
        st->xq = aligned_alloc(64, (need + 63) / 64 * 64);
        if (!st->xq) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "cpu matmul: %zu bytes of activations", need);
        st->xq_bytes = need;
    }
    int8_t *qs = st->xq;
    float *d8 = (float *)((char *)st->xq + qbytes), *s8 = (float *)((char *)st->xq + qbytes + sbytes);
    *out = (tri__cpu_xq){qs, d8, s8, k};
    quantize_job j = {st->kr, out, x};
    cpu_parallel(be, m, 1, m * k, quantize_rows, &j);
    return TRI_STATUS_OK;
}

typedef struct matmul_job {
    float *y;
    const float *x;
    const char *w;
    const tri__cpu_xq *xq;
    tri__cpu_tile_f tf;
    tri__cpu_tile_q tq;
    int64_t m, n, k, row_bytes, tn;
} matmul_job;

// Tasks t0 .. t1 - 1: MATMUL_W_ROWS rows of W each, against every row of x.
static void matmul_tasks(void *arg, int64_t t0, int64_t t1) {
    const matmul_job *j = arg;
    int64_t m = j->m, n = j->n, k = j->k, rb = j->row_bytes, tn = j->tn, nb8 = k / TRI_QK * 8;
    int64_t r0 = t0 * MATMUL_W_ROWS, r_end = t1 * MATMUL_W_ROWS < n ? t1 * MATMUL_W_ROWS : n;
    for (; r0 < r_end; r0 += MATMUL_W_ROWS) {
        int64_t r1 = r0 + MATMUL_W_ROWS < r_end ? r0 + MATMUL_W_ROWS : r_end;
        for (int64_t i0 = 0; i0 < m; i0 += MATMUL_X_ROWS) {
            int64_t i1 = i0 + MATMUL_X_ROWS < m ? i0 + MATMUL_X_ROWS : m;
            for (int64_t r = r0; r < r1; r += tn) {
                int64_t nr = r1 - r < tn ? r1 - r : tn;
                for (int64_t i = i0; i < i1; i += TRI_CPU_TILE_M) {
                    int64_t mr = i1 - i < TRI_CPU_TILE_M ? i1 - i : TRI_CPU_TILE_M;
                    if (j->tq) {
                        tri__cpu_xq sub = {j->xq->qs + i * k, j->xq->d8 + i * nb8, j->xq->s8 + i * nb8, k};
                        j->tq(j->y + i * n + r, n, &sub, mr, j->w + r * rb, rb, nr);
                    } else {
                        j->tf(j->y + i * n + r, n, j->x + i * k, mr, j->w + r * rb, rb, nr, k);
                    }
                }
            }
        }
    }
}

static tri_status cpu_matmul(tri__backend *be, float *y, const float *x, const void *w, tri_dtype type,
                             int64_t m, int64_t n, int64_t k) {
    cpu_state *st = cpu_priv(be);
    const tri__cpu_kernels *kr = st->kr;
    int64_t row_bytes = tri__dtype_row_bytes(type, k);
    if (row_bytes <= 0 || m < 0 || n < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cpu matmul: W (%lld, %lld) %s", (long long)n,
                         (long long)k, tri_dtype_name(type));
    if (m == 0 || n == 0) return TRI_STATUS_OK;
    tri__cpu_tile_f tf = NULL;
    tri__cpu_tile_q tq = NULL;
    switch (type) {
    case TRI_DTYPE_F32: tf = kr->tile_f32; break;
    case TRI_DTYPE_F16: tf = kr->tile_f16; break;
    case TRI_DTYPE_BF16: tf = kr->tile_bf16; break;
    case TRI_DTYPE_Q8_0: tq = kr->tile_q8_0; break;
    case TRI_DTYPE_Q4_0: tq = kr->tile_q4_0; break;
    case TRI_DTYPE_Q4_1: tq = kr->tile_q4_1; break;
    case TRI_DTYPE_Q5_0: tq = kr->tile_q5_0; break;
    case TRI_DTYPE_Q5_1: tq = kr->tile_q5_1; break;
    case TRI_DTYPE_Q2_K: tq = kr->tile_q2_k; break;
    case TRI_DTYPE_Q3_K: tq = kr->tile_q3_k; break;
    case TRI_DTYPE_Q4_K: tq = kr->tile_q4_k; break;
    case TRI_DTYPE_Q5_K: tq = kr->tile_q5_k; break;
    case TRI_DTYPE_Q6_K: tq = kr->tile_q6_k; break;
    case TRI_DTYPE_IQ4_NL: tq = kr->tile_iq4_nl; break;
    case TRI_DTYPE_IQ4_XS: tq = kr->tile_iq4_xs; break;
    default: return tri__fail(TRI_STATUS_UNSUPPORTED, "cpu matmul: %s weights", tri_dtype_name(type));
    }
    tri__cpu_xq xq = {0};
    if (tq) {
        tri_status s = cpu_quantize_x(be, x, m, k, &xq);
        if (s) return s;
    }
    matmul_job j = {y, x, w, &xq, tf, tq, m, n, k, row_bytes, kr->tile_n};
    int64_t n_tasks = (n + MATMUL_W_ROWS - 1) / MATMUL_W_ROWS;
    // work in bytes-ish of W streamed per row of x: a decode step's small projections still split
    cpu_parallel(be, n_tasks, 1, m * n * k / 8, matmul_tasks, &j);
    return TRI_STATUS_OK;
}

// ---- elementwise and normalisation ----

typedef struct rmsnorm_job {
    float *y;
    const float *x;
    const void *weight;
    tri_dtype wt;
    int64_t n;
    float eps;
} rmsnorm_job;

static void rmsnorm_rows(void *arg, int64_t i0, int64_t i1) {
    const rmsnorm_job *jb = arg;
    int64_t n = jb->n;
    tri_dtype wt = jb->wt;
    const void *weight = jb->weight;
    for (int64_t i = i0; i < i1; i++) {
        const float *xr = jb->x + i * n;
        float *yr = jb->y + i * n;
        double ss = 0;  // double: n up to 16K squares of activations with outliers
        for (int64_t j = 0; j < n; j++) ss += (double)xr[j] * (double)xr[j];
        float s = (float)(1.0 / sqrt(ss / (double)n + (double)jb->eps));
        for (int64_t j = 0; j < n; j++) {
            float wj = wt == TRI_DTYPE_F32   ? ((const float *)weight)[j]
                       : wt == TRI_DTYPE_F16 ? tri__f16_to_f32(((const uint16_t *)weight)[j])
                                             : tri__bf16_to_f32(((const uint16_t *)weight)[j]);
            yr[j] = xr[j] * s * wj;
        }
    }
}

static tri_status cpu_rmsnorm(tri__backend *be, float *y, const float *x, const void *weight, tri_dtype wt,
                              int64_t m, int64_t n, float eps) {
    if (wt != TRI_DTYPE_F32 && wt != TRI_DTYPE_F16 && wt != TRI_DTYPE_BF16)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "cpu rmsnorm: %s weight", tri_dtype_name(wt));
    if (n <= 0 || m < 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cpu rmsnorm: n = %lld", (long long)n);
    rmsnorm_job j = {y, x, weight, wt, n, eps};
    cpu_parallel(be, m, 1, m * n, rmsnorm_rows, &j);
    return TRI_STATUS_OK;
}

typedef struct rope_job {
    float *x;
    int64_t n_heads;
    const int32_t *pos;
    const tri__rope *rope;
} rope_job;

static void rope_rows(void *arg, int64_t i0, int64_t i1) {
    const rope_job *jb = arg;
    const tri__rope *rope = jb->rope;
    int64_t hd = rope->head_dim, half = hd / 2, n_heads = jb->n_heads;
    bool adjacent = rope->layout == TRI_ROPE_LAYOUT_ADJACENT;
    for (int64_t i = i0; i < i1; i++) {
        for (int64_t p = 0; p < half; p++) {
            // float32 angle, as HF computes (inv_freq @ positions) in float32
            float angle = (float)jb->pos[i] * rope->inv_freq[p];
            float c = cosf(angle) * rope->attn_factor, s = sinf(angle) * rope->attn_factor;
            for (int64_t h = 0; h < n_heads; h++) {
                float *xh = jb->x + (i * n_heads + h) * hd;
                int64_t a = adjacent ? 2 * p : p, b = adjacent ? 2 * p + 1 : p + half;
                float x0 = xh[a], x1 = xh[b];
                xh[a] = x0 * c - x1 * s;
                xh[b] = x0 * s + x1 * c;
            }
        }
    }
}

static tri_status cpu_rope(tri__backend *be, float *x, int64_t m, int64_t n_heads, const int32_t *pos,
                           const tri__rope *rope) {
    for (int64_t i = 0; i < m; i++)
        if (pos[i] < 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cpu rope: position %d", pos[i]);
    rope_job j = {x, n_heads, pos, rope};
    cpu_parallel(be, m, 1, m * n_heads * rope->head_dim, rope_rows, &j);
    return TRI_STATUS_OK;
}

typedef struct swiglu_job {
    float *out;
    const float *gate, *up;
} swiglu_job;

static void swiglu_range(void *arg, int64_t i0, int64_t i1) {
    const swiglu_job *j = arg;
    for (int64_t i = i0; i < i1; i++) {
        float g = j->gate[i];
        j->out[i] = g / (1.0f + expf(-g)) * j->up[i];
    }
}

static tri_status cpu_swiglu(tri__backend *be, float *out, const float *gate, const float *up, int64_t n) {
    swiglu_job j = {out, gate, up};
    cpu_parallel(be, n, 4096, n * 8, swiglu_range, &j);
    return TRI_STATUS_OK;
}

static tri_status cpu_add(tri__backend *be, float *out, const float *a, const float *b, int64_t n) {
    (void)be;
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
    return TRI_STATUS_OK;
}

static void geglu_range(void *arg, int64_t i0, int64_t i1) {
    const swiglu_job *j = arg;
    const float c = 0.7978845608028654f;  // sqrt(2 / pi)
    for (int64_t i = i0; i < i1; i++) {
        float g = j->gate[i];
        j->out[i] = 0.5f * g * (1.0f + tanhf(c * (g + 0.044715f * g * g * g))) * j->up[i];
    }
}

static tri_status cpu_geglu(tri__backend *be, float *out, const float *gate, const float *up, int64_t n) {
    swiglu_job j = {out, gate, up};
    cpu_parallel(be, n, 4096, n * 8, geglu_range, &j);
    return TRI_STATUS_OK;
}

static tri_status cpu_scale(tri__backend *be, float *x, int64_t n, float s) {
    (void)be;
    for (int64_t i = 0; i < n; i++) x[i] *= s;
    return TRI_STATUS_OK;
}

static tri_status cpu_add_rows(tri__backend *be, float *x, const float *b, int64_t m, int64_t n) {
    (void)be;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) x[i * n + j] += b[j];
    return TRI_STATUS_OK;
}

// ---- sampling helpers ----

static tri_status cpu_softmax(tri__backend *be, float *x, int64_t m, int64_t n, float temperature) {
    (void)be;
    if (!(temperature > 0) || n <= 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cpu softmax: temperature %g, n %lld", (double)temperature,
                         (long long)n);
    float it = 1.0f / temperature;
    for (int64_t i = 0; i < m; i++) {
        float *r = x + i * n;
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; j++) mx = fmaxf(mx, r[j] * it);
        if (mx == -INFINITY)
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cpu softmax: row %lld is all -inf", (long long)i);
        double sum = 0;
        for (int64_t j = 0; j < n; j++) {
            r[j] = expf(r[j] * it - mx);
            sum += (double)r[j];
        }
        float inv = (float)(1.0 / sum);
        for (int64_t j = 0; j < n; j++) r[j] *= inv;
    }
    return TRI_STATUS_OK;
}

// a ranks before b: larger value, NaN last, ties by the lower index.
static bool topk_before(float va, int32_t ia, float vb, int32_t ib) {
    bool na = isnan(va), nb = isnan(vb);
    if (na != nb) return nb;
    if (!na && va != vb) return va > vb;
    return ia < ib;
}

typedef struct topk_pair {
    float v;
    int32_t i;
} topk_pair;

static int topk_cmp(const void *pa, const void *pb) {
    const topk_pair *a = pa, *b = pb;
    return topk_before(a->v, a->i, b->v, b->i) ? -1 : 1;
}

static tri_status cpu_top_k(tri__backend *be, float *values, int32_t *indices, const float *x, int64_t m,
                            int64_t n, int64_t k) {
    (void)be;
    if (k < 1 || k > n || n > INT32_MAX)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cpu top_k: k = %lld of n = %lld", (long long)k, (long long)n);
    topk_pair *pairs = NULL;
    if (k > 64) {
        pairs = malloc(sizeof *pairs * (size_t)n);
        if (!pairs) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "cpu top_k: %lld pairs", (long long)n);
    }
    for (int64_t r = 0; r < m; r++) {
        const float *xr = x + r * n;
        float *vr = values + r * k;
        int32_t *ir = indices + r * k;
        if (pairs) {  // large k (top-p wants the whole sorted row): sort everything
            for (int64_t j = 0; j < n; j++) pairs[j] = (topk_pair){xr[j], (int32_t)j};
            qsort(pairs, (size_t)n, sizeof *pairs, topk_cmp);
            for (int64_t j = 0; j < k; j++) {
                vr[j] = pairs[j].v;
                ir[j] = pairs[j].i;
            }
            continue;
        }
        // small k: insertion into a sorted list of the best so far, O(n) for most rows
        int64_t len = 0;
        for (int64_t j = 0; j < n; j++) {
            float v = xr[j];
            if (len == k && !topk_before(v, (int32_t)j, vr[k - 1], ir[k - 1])) continue;
            int64_t p = len < k ? len++ : k - 1;
            while (p > 0 && topk_before(v, (int32_t)j, vr[p - 1], ir[p - 1])) {
                vr[p] = vr[p - 1];
                ir[p] = ir[p - 1];
                p--;
            }
            vr[p] = v;
            ir[p] = (int32_t)j;
        }
    }
    free(pairs);
    return TRI_STATUS_OK;
}

// ---- attention ----
//
// Flash-attention style. A KV head's keys, in span order, are cut into chunks of ATTN_CHUNK keys
// at fixed offsets (0, ATTN_CHUNK, 2 ATTN_CHUNK, ...), and a chunk into blocks of ATTN_TILE keys
// (restarting at each span). A task is (KV head h, block of queries) or, when there are few such
// pairs (decode), (KV head h, block of queries, chunk): its rows are the block's queries times the
// g query heads of the group, so every key and value row loaded serves all of them (the kernels'
// tiles). Per chunk a task runs, block by block, the scores of all rows against the block, the
// causal mask, an online-softmax step per row and the values, which leaves each row a partial
// (max m_c, sum s_c, accumulator a_c). The partials are folded in chunk order, by the task that
// walks all of a head's chunks or by attn_merge after the chunk tasks:
//   M' = max(M, m_c), S' = S e^(M - M') + s_c e^(m_c - M'), A' = A e^(M - M') + a_c e^(m_c - M'),
// and out = A / S.
//
// Batch invariance: a (query, head) row gets the same bits whatever the other queries of the call
// (m, its place among them, who shares its tile), the thread count, and whatever keys the view holds
// after the last one it sees. Its chunks and blocks start at offsets fixed by the view, not by the
// tasks; the kernels treat each row alone; a key it does not see is masked to -inf and adds exactly
// 0 (every level adds trailing masked lanes as zeros); a chunk in which it sees nothing is skipped
// by the fold; tasks only decide where a chunk is computed, never how. So a step that verifies a
// draft in one pass gives each token the row decoding it alone would (speculative decoding's
// greedy equality).

#define ATTN_TILE 128      // keys per block: bounds the scratch whatever the context length
#define ATTN_ROWS 64       // (query, head) rows per task at most: the block of queries is 64 / g
#define ATTN_CHUNK TRI_ATTN_CHUNK  // keys per chunk: each chunk is a task of its own when a head's keys are split
#define ATTN_TASKS 8       // split the chunks into tasks below this many (KV head, query block) pairs

static int32_t attn_key_pos(const tri__kv_span *sp, int64_t j) { return sp->pos ? sp->pos[j] : sp->pos0 + (int32_t)j; }

// The longest head whose quantized keys the weight sums' pass reads (a row on the stack).
#define ATTN_DQ_MAX 512

static float attn_dot(const tri__cpu_kernels *kr, tri_dtype t, const float *q, const void *rows, int64_t j,
                      int64_t stride, int64_t hd) {
    if (t == TRI_DTYPE_F16) return kr->dot_f16(q, (const uint16_t *)rows + j * stride, hd);
    if (t == TRI_DTYPE_Q8_0 || t == TRI_DTYPE_Q4_0) {  // the row's values in f32, as the main pass reads them
        float x[ATTN_DQ_MAX];
        tri__dequantize_row(x, (const uint8_t *)rows + tri__dtype_row_bytes(t, j * stride), t, hd);
        return kr->dot_f32(q, x, hd);
    }
    return kr->dot_f32(q, (const float *)rows + j * stride, hd);
}

typedef struct attn_job {
    const tri__cpu_kernels *kr;
    float *out;
    const float *q;
    const int32_t *q_pos;
    int64_t m, n_head, hd, g;
    const tri__kv_view *kv;
    float *weight_sums;
    float *stats;  // NULL, or (m, n_head, 2) each row's final max and sum (for the weight sums)
    float *state;  // NULL, or (m, n_head, hd + 2): each row's folded accumulator, max and sum
                   // instead of out (attention_state)
    float scale;
    int64_t qb, n_qb;         // queries per block, blocks
    int64_t n_chunk;          // chunks of the longest head
    const int64_t *head_keys; // (n_head_kv) keys of each head
    float *part;              // NULL, or a task per chunk: (n_head_kv, n_qb, n_chunk, qb * g, hd + 2)
                              // each row's partial accumulator, max, sum
    bool oom;                 // a range could not allocate its scratch
} attn_job;

// Scratch of one thread: packed scaled queries (rows, hd), scores (rows, ATTN_TILE), the chunk's
// accumulators (rows, hd), running max and sum (rows), and the fold's (rows, hd), (rows), (rows).
// With a quantized cache also the block's keys or values dequantized (ATTN_TILE, hd): the cache is
// read in place, a block of rows at a time.
typedef struct attn_scratch {
    float *q, *s, *acc, *mx, *sum, *facc, *fmx, *fsum, *kq;
} attn_scratch;

// out (nk, hd) f32 = rows j0 .. j0 + nk - 1 of a span of a quantized type (Q8_0, Q4_0): row j starts
// tri__dtype_row_bytes(type, j * stride) bytes past base (stride and hd whole blocks).
static void attn_rows_f32(float *out, tri_dtype type, const void *base, int64_t j0, int64_t nk, int64_t stride,
                          int64_t hd) {
    for (int64_t j = 0; j < nk; j++)
        cpu_row_to_f32(out + j * hd, (const uint8_t *)base + tri__dtype_row_bytes(type, (j0 + j) * stride), type, 0,
                       hd);
}

// Masks block scores s (rows, ATTN_TILE) of keys j0 .. j0 + nk of span sp for the queries i0 ..
// i0 + nq that do not see all of them.
static void attn_mask(const attn_job *jb, const tri__kv_span *sp, int64_t j0, int64_t nk, int32_t kp_max, int64_t i0,
                      int64_t nq, float *s) {
    const tri__kv_tree *t = jb->kv->tree;
    for (int64_t qi = 0; qi < nq; qi++) {
        int32_t qp = jb->q_pos[i0 + qi];
        bool in_tree = t && qp >= t->row0 && qp < t->row0 + t->n && kp_max >= t->row0;
        if (qp >= kp_max && !in_tree) continue;
        for (int64_t a = 0; a < jb->g; a++) {
            float *row = s + (qi * jb->g + a) * ATTN_TILE;
            if (in_tree) {  // a tree node: its ancestors among the tree's keys
                for (int64_t j = 0; j < nk; j++)
                    if (!tri__kv_tree_sees(t, qp, attn_key_pos(sp, j0 + j))) row[j] = -INFINITY;
            } else if (!sp->pos) {  // keys before qp + 1 visible
                int64_t vis = (int64_t)qp - (sp->pos0 + j0) + 1;
                for (int64_t j = vis < 0 ? 0 : vis; j < nk; j++) row[j] = -INFINITY;
            } else {
                for (int64_t j = 0; j < nk; j++)
                    if (sp->pos[j0 + j] > qp) row[j] = -INFINITY;
            }
        }
    }
}

// Soft-caps block scores s (rows, ATTN_TILE), nk keys a row: cap * tanh(s / cap), as transformers'
// Gemma 2 does to the scaled scores before the mask.
static void attn_softcap(float *s, int64_t rows, int64_t nk, float cap) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < nk; j++) s[r * ATTN_TILE + j] = cap * tanhf(s[r * ATTN_TILE + j] / cap);
}

// Chunk c of KV head h for the rows of queries i0 .. i0 + nq (positions qmin .. qmax), whose
// packed queries are in w->q: leaves each row's partial in w->acc, w->mx, w->sum (max -inf: the
// row sees no key of the chunk).
static void attn_chunk(const attn_job *jb, int64_t h, int64_t c, int64_t i0, int64_t nq, int32_t qmin, int32_t qmax,
                       attn_scratch *w) {
    const tri__kv_view *kv = jb->kv;
    const tri__cpu_kernels *kr = jb->kr;
    int64_t hd = jb->hd, rows = nq * jb->g;
    for (int64_t r = 0; r < rows; r++) w->mx[r] = -INFINITY, w->sum[r] = 0;
    memset(w->acc, 0, sizeof(float) * (size_t)(rows * hd));

    // the chunk's keys: [k0, k1) of the head's keys in span order
    int64_t nh = jb->head_keys[h], k0 = c * ATTN_CHUNK, k1 = k0 + ATTN_CHUNK < nh ? k0 + ATTN_CHUNK : nh, off = 0;
    for (int32_t si = kv->head_span[h]; si < kv->head_span[h + 1] && off < k1; si++) {
        const tri__kv_span *sp = &kv->spans[si];
        int64_t a = k0 - off > 0 ? k0 - off : 0, b = k1 - off < sp->n ? k1 - off : sp->n;
        off += sp->n;
        if (!sp->pos) {  // consecutive positions: no key past the last query's position
            int64_t vis = (int64_t)qmax - sp->pos0 + 1;
            b = vis < b ? vis : b;
        }
        for (int64_t j0 = a; j0 < b; j0 += ATTN_TILE) {
            int64_t nk = b - j0 < ATTN_TILE ? b - j0 : ATTN_TILE;
            int32_t kp_min = attn_key_pos(sp, j0), kp_max = attn_key_pos(sp, j0 + nk - 1);
            if (sp->pos)
                for (int64_t j = 0; j < nk; j++) {
                    kp_min = sp->pos[j0 + j] < kp_min ? sp->pos[j0 + j] : kp_min;
                    kp_max = sp->pos[j0 + j] > kp_max ? sp->pos[j0 + j] : kp_max;
                }
            if (kp_min > qmax) continue;  // no query sees any key of the block
            const tri_dtype ty = tri__kv_span_type(kv, sp);
            if (ty == TRI_DTYPE_F16)
                kr->attn_scores_f16(w->s, ATTN_TILE, w->q, rows, (const uint16_t *)sp->k + j0 * sp->stride, sp->stride,
                                    nk, hd);
            else if (ty != TRI_DTYPE_F32) {  // quantized: the block's keys in f32, then as f32 rows
                attn_rows_f32(w->kq, ty, sp->k, j0, nk, sp->stride, hd);
                kr->attn_scores_f32(w->s, ATTN_TILE, w->q, rows, w->kq, hd, nk, hd);
            } else
                kr->attn_scores_f32(w->s, ATTN_TILE, w->q, rows, (const float *)sp->k + j0 * sp->stride, sp->stride,
                                    nk, hd);
            if (kv->softcap > 0) attn_softcap(w->s, rows, nk, kv->softcap);
            const tri__kv_tree *t = kv->tree;
            if (kp_max > qmin || (t && kp_max >= t->row0 && qmax >= t->row0))
                attn_mask(jb, sp, j0, nk, kp_max, i0, nq, w->s);
            for (int64_t r = 0; r < rows; r++) {
                float old = w->mx[r], f = kr->attn_softmax(w->s + r * ATTN_TILE, nk, &w->mx[r], &w->sum[r]);
                if (f != 1.0f && old != -INFINITY)  // (while the max is -inf, acc holds zeros)
                    for (int64_t e = 0; e < hd; e++) w->acc[r * hd + e] *= f;
            }
            if (ty == TRI_DTYPE_F16)
                kr->attn_accum_f16(w->acc, w->s, ATTN_TILE, rows, (const uint16_t *)sp->v + j0 * sp->stride,
                                   sp->stride, nk, hd);
            else if (ty != TRI_DTYPE_F32) {
                attn_rows_f32(w->kq, ty, sp->v, j0, nk, sp->stride, hd);
                kr->attn_accum_f32(w->acc, w->s, ATTN_TILE, rows, w->kq, hd, nk, hd);
            } else
                kr->attn_accum_f32(w->acc, w->s, ATTN_TILE, rows, (const float *)sp->v + j0 * sp->stride, sp->stride,
                                   nk, hd);
        }
    }
}

// Folds a chunk's partial (pacc (hd), pmx, psum) of a row into the row's running (acc (hd), *mx,
// *sum), which start as (0, -inf, 0). The one fold both paths use, so they agree to the bit.
static void attn_fold(float *acc, float *mx, float *sum, const float *pacc, float pmx, float psum, int64_t hd) {
    if (pmx == -INFINITY) return;  // the row sees no key of the chunk
    if (*mx == -INFINITY) {         // the first chunk it sees a key of
        memcpy(acc, pacc, sizeof(float) * (size_t)hd);
        *mx = pmx, *sum = psum;
        return;
    }
    float m = fmaxf(*mx, pmx), fa = expf(*mx - m), fc = expf(pmx - m);
    *sum = *sum * fa + psum * fc;
    for (int64_t e = 0; e < hd; e++) acc[e] = acc[e] * fa + pacc[e] * fc;
    *mx = m;
}

// Writes row `row` of the output from its folded (acc (hd), mx, sum); acc may be the output row.
static void attn_finish(const attn_job *jb, int64_t row, const float *acc, float mx, float sum) {
    if (jb->state) {  // the state before the division, for a merge with more chunks
        float *st = jb->state + row * (jb->hd + 2);
        memmove(st, acc, sizeof(float) * (size_t)jb->hd);  // (acc may be out, never state)
        st[jb->hd] = mx, st[jb->hd + 1] = sum;
        return;
    }
    float inv = sum > 0 ? 1.0f / sum : 0.0f;  // a query that sees no key: zeros
    for (int64_t e = 0; e < jb->hd; e++) jb->out[row * jb->hd + e] = acc[e] * inv;
    if (jb->stats) jb->stats[2 * row] = mx, jb->stats[2 * row + 1] = sum;
}

static void attn_task(attn_job *jb, int64_t t, attn_scratch *w) {
    int64_t u = jb->part ? t / jb->n_chunk : t;  // the (KV head, query block) pair
    int64_t qbi = u % jb->n_qb, h = u / jb->n_qb;
    int64_t g = jb->g, hd = jb->hd, i0 = qbi * jb->qb, nq = jb->m - i0 < jb->qb ? jb->m - i0 : jb->qb, rows = nq * g;
    int32_t qmin = INT32_MAX, qmax = INT32_MIN;
    for (int64_t qi = 0; qi < nq; qi++) {
        int32_t qp = jb->q_pos[i0 + qi];
        qmin = qp < qmin ? qp : qmin;
        qmax = qp > qmax ? qp : qmax;
        const float *src = jb->q + ((i0 + qi) * jb->n_head + h * g) * hd;  // the group's g heads, contiguous
        for (int64_t e = 0; e < g * hd; e++) w->q[qi * g * hd + e] = src[e] * jb->scale;
    }

    if (jb->part) {  // one chunk: leave the partial for attn_merge
        attn_chunk(jb, h, t % jb->n_chunk, i0, nq, qmin, qmax, w);
        float *p = jb->part + t * jb->qb * g * (hd + 2);
        for (int64_t r = 0; r < rows; r++) {
            memcpy(p + r * (hd + 2), w->acc + r * hd, sizeof(float) * (size_t)hd);
            p[r * (hd + 2) + hd] = w->mx[r];
            p[r * (hd + 2) + hd + 1] = w->sum[r];
        }
        return;
    }
    for (int64_t r = 0; r < rows; r++) w->fmx[r] = -INFINITY, w->fsum[r] = 0;
    memset(w->facc, 0, sizeof(float) * (size_t)(rows * hd));
    for (int64_t c = 0; c * ATTN_CHUNK < jb->head_keys[h]; c++) {
        attn_chunk(jb, h, c, i0, nq, qmin, qmax, w);
        for (int64_t r = 0; r < rows; r++)
            attn_fold(w->facc + r * hd, &w->fmx[r], &w->fsum[r], w->acc + r * hd, w->mx[r], w->sum[r], hd);
    }
    for (int64_t r = 0; r < rows; r++)
        attn_finish(jb, (i0 + r / g) * jb->n_head + h * g + r % g, w->facc + r * hd, w->fmx[r], w->fsum[r]);
}

// Tasks t0 .. t1 - 1 with one scratch.
static void attn_tasks(void *arg, int64_t t0, int64_t t1) {
    attn_job *jb = arg;
    int64_t rows = jb->qb * jb->g, hd = jb->hd;
    bool quant = tri__dtype_is_quantized(jb->kv->type) || jb->kv->span_types;
    float *base = malloc(sizeof(float) * (size_t)(rows * (3 * hd + ATTN_TILE + 4) + (quant ? ATTN_TILE * hd : 0)));
    if (!base) {
        jb->oom = true;  // benign race: every writer stores true
        return;
    }
    float *p = base;
    attn_scratch w;
    w.q = p, p += rows * hd;
    w.s = p, p += rows * ATTN_TILE;
    w.acc = p, p += rows * hd;
    w.mx = p, p += rows;
    w.sum = p, p += rows;
    w.facc = p, p += rows * hd;
    w.fmx = p, p += rows;
    w.fsum = p, p += rows;
    w.kq = quant ? p : NULL;
    for (int64_t t = t0; t < t1; t++) attn_task(jb, t, &w);
    free(base);
}

// Folds the chunk partials of (KV head, query block) pairs u0 .. u1 - 1 in chunk order.
static void attn_merge(void *arg, int64_t u0, int64_t u1) {
    const attn_job *jb = arg;
    int64_t g = jb->g, hd = jb->hd, nc = jb->n_chunk, prow = jb->qb * g * (hd + 2);
    for (int64_t u = u0; u < u1; u++) {
        int64_t qbi = u % jb->n_qb, h = u / jb->n_qb, i0 = qbi * jb->qb;
        int64_t nq = jb->m - i0 < jb->qb ? jb->m - i0 : jb->qb;
        const float *part = jb->part + u * nc * prow;
        for (int64_t r = 0; r < nq * g; r++) {
            int64_t row = (i0 + r / g) * jb->n_head + h * g + r % g;
            float *o = jb->out + row * hd, mx = -INFINITY, sum = 0;
            memset(o, 0, sizeof(float) * (size_t)hd);
            for (int64_t c = 0; c * ATTN_CHUNK < jb->head_keys[h]; c++) {
                const float *p = part + c * prow + r * (hd + 2);
                attn_fold(o, &mx, &sum, p, p[hd], p[hd + 1], hd);
            }
            attn_finish(jb, row, o, mx, sum);
        }
    }
}

// The weight sums' second pass for KV heads h0 .. h1 - 1 (so no two threads write the same sum):
// recompute each score and add its final probability exp(s - max) / sum.
static void attn_weight_sums(void *arg, int64_t h0, int64_t h1) {
    const attn_job *jb = arg;
    const tri__kv_view *kv = jb->kv;
    int64_t g = jb->g, hd = jb->hd, n_head = jb->n_head;
    const float *stats = jb->stats;
    for (int64_t h = h0; h < h1; h++) {
        int64_t off = 0;
        for (int32_t si = 0; si < kv->head_span[h]; si++) off += kv->spans[si].n;
        for (int32_t si = kv->head_span[h]; si < kv->head_span[h + 1]; si++) {
            const tri__kv_span *sp = &kv->spans[si];
            for (int64_t j = 0; j < sp->n; j++) {
                int32_t kp = attn_key_pos(sp, j);
                double w = 0;
                for (int64_t i = 0; i < jb->m; i++) {
                    if (!tri__kv_tree_sees(kv->tree, jb->q_pos[i], kp)) continue;
                    for (int64_t a = 0; a < g; a++) {
                        int64_t qa = i * n_head + h * g + a;
                        float sc = attn_dot(jb->kr, tri__kv_span_type(kv, sp), jb->q + qa * hd, sp->k, j, sp->stride,
                                            hd) *
                                   jb->scale;
                        if (kv->softcap > 0) sc = kv->softcap * tanhf(sc / kv->softcap);
                        w += (double)(expf(sc - stats[2 * qa]) / stats[2 * qa + 1]);
                    }
                }
                jb->weight_sums[off + j] = (float)w;
            }
            off += sp->n;
        }
    }
}

// Whether the attention reads keys and values of type ty (quantized: whole blocks per head, no
// weight sums).
static tri_status attn_type_ok(tri_dtype ty, int64_t hd, const float *weight_sums) {
    if (!tri__kv_type_ok(ty)) return tri__fail(TRI_STATUS_UNSUPPORTED, "cpu attention: %s keys", tri_dtype_name(ty));
    if (tri__dtype_is_quantized(ty) && (hd % TRI_QK != 0 || (weight_sums && hd > ATTN_DQ_MAX)))
        return tri__fail(TRI_STATUS_UNSUPPORTED, "cpu attention: %s keys with head_dim %lld%s", tri_dtype_name(ty),
                         (long long)hd, weight_sums ? " and weight sums (H2O: head_dim up to 512)" : "");
    return TRI_STATUS_OK;
}

// The attention op and its two partial forms. out (m, n_head, hd) as the op; or state (m, n_head,
// hd + 2): each row's folded (accumulator, max, sum) without the division; or chunks (n_chunk, m,
// n_head, hd + 2): each chunk's own partial, n_chunk = ceil(longest head's keys / ATTN_CHUNK), with
// (0, -inf, 0) where a row sees no key of the chunk. Exactly one of out, state, chunks is set.
static tri_status attn_run(tri__backend *be, float *out, float *state, float *chunks, const float *q,
                           const int32_t *q_pos, int64_t m, int64_t n_head, int64_t hd, const tri__kv_view *kv,
                           float *weight_sums) {
    cpu_state *st = cpu_priv(be);
    int64_t nkv = kv->n_head_kv;
    if (nkv <= 0 || n_head <= 0 || n_head % nkv != 0 || hd <= 0 || m < 0)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cpu attention: %lld heads over %lld KV heads, head_dim %lld",
                         (long long)n_head, (long long)nkv, (long long)hd);
    int64_t n_keys = 0;
    if (!kv->span_types) TRY(attn_type_ok(kv->type, hd, weight_sums));
    for (int32_t si = 0; kv->span_types && si < kv->head_span[nkv]; si++)
        TRY(attn_type_ok(kv->spans[si].type, hd, weight_sums));
    for (int32_t si = 0; si < kv->head_span[nkv]; si++) {
        const tri_dtype ty = tri__kv_span_type(kv, &kv->spans[si]);
        if (kv->spans[si].n < 0 || (kv->spans[si].n > 0 && kv->spans[si].stride < hd) ||
            (tri__dtype_is_quantized(ty) && kv->spans[si].stride % TRI_QK != 0))
            return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cpu attention: span %d has %d rows of stride %lld", si,
                             kv->spans[si].n, (long long)kv->spans[si].stride);
        n_keys += kv->spans[si].n;
    }
    int64_t *head_keys = malloc(sizeof(int64_t) * (size_t)nkv), max_keys = 0;
    // running max and sum of every (query, head), for the weight sums' second pass
    float *stats = weight_sums ? malloc(sizeof(float) * 2 * (size_t)(m * n_head)) : NULL;
    if (!head_keys || (weight_sums && !stats)) {
        free(head_keys), free(stats);
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "cpu attention: statistics of %lld queries", (long long)m);
    }
    for (int64_t h = 0; h < nkv; h++) {
        head_keys[h] = 0;
        for (int32_t si = kv->head_span[h]; si < kv->head_span[h + 1]; si++) head_keys[h] += kv->spans[si].n;
        max_keys = head_keys[h] > max_keys ? head_keys[h] : max_keys;
    }
    int64_t g = n_head / nkv, qb = ATTN_ROWS / g < 1 ? 1 : ATTN_ROWS / g;
    qb = qb < m ? qb : (m < 1 ? 1 : m);
    int64_t n_qb = (m + qb - 1) / qb;
    // work: scores and value rows touched, n_keys counting every KV head's keys
    int64_t work = m * g * (n_keys + 1) * hd;
    // a task per chunk when there are fewer than ATTN_TASKS (KV head, query block) pairs, so that
    // decoding (few KV heads, many keys) keeps the threads busy. Either way gives the same bits
    // (see above), so neither the thread count nor m changes a result, and a failed allocation of
    // the partials may fall back to a task per pair. The chunks' form always takes a task per chunk.
    int64_t n_chunk = (max_keys + ATTN_CHUNK - 1) / ATTN_CHUNK;
    float *part = NULL;
    if (chunks || (nkv * n_qb < ATTN_TASKS && n_chunk > 1))
        part = malloc(sizeof(float) * (size_t)(nkv * n_qb * (n_chunk > 0 ? n_chunk : 1) * qb * g * (hd + 2)));
    if (chunks && !part) {
        free(stats), free(head_keys);
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "cpu attention: partials of %lld chunks", (long long)n_chunk);
    }
    attn_job j = {st->kr, out, q, q_pos, m, n_head, hd, g, kv, weight_sums, stats, state, 1.0f / sqrtf((float)hd),
                  qb, n_qb, n_chunk, head_keys, part, false};
    if (m > 0 && (!chunks || n_chunk > 0)) cpu_parallel(be, nkv * n_qb * (part ? n_chunk : 1), 1, work, attn_tasks, &j);
    if (!j.oom && part && !chunks) attn_merge(&j, 0, nkv * n_qb);
    if (!j.oom && chunks) {  // from the tasks' (KV head, query block, chunk, row) order to (chunk, query, head)
        int64_t prow = qb * g * (hd + 2);
        for (int64_t u = 0; u < nkv * n_qb; u++) {
            int64_t qbi = u % n_qb, h = u / n_qb, i0 = qbi * qb, nq = m - i0 < qb ? m - i0 : qb;
            for (int64_t c = 0; c < n_chunk; c++)
                for (int64_t r = 0; r < nq * g; r++) {
                    int64_t row = (i0 + r / g) * n_head + h * g + r % g;
                    memcpy(chunks + (c * m * n_head + row) * (hd + 2), part + (u * n_chunk + c) * prow + r * (hd + 2),
                           sizeof(float) * (size_t)(hd + 2));
                }
        }
    }
    if (!j.oom && weight_sums) cpu_parallel(be, nkv, 1, work, attn_weight_sums, &j);
    free(stats), free(part), free(head_keys);
    if (j.oom) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "cpu attention: scratch");
    return TRI_STATUS_OK;
}

static tri_status cpu_attention(tri__backend *be, float *out, const float *q, const int32_t *q_pos, int64_t m,
                                int64_t n_head, int64_t hd, const tri__kv_view *kv, float *weight_sums) {
    return attn_run(be, out, NULL, NULL, q, q_pos, m, n_head, hd, kv, weight_sums);
}

static tri_status cpu_attention_state(tri__backend *be, float *state, const float *q, const int32_t *q_pos, int64_t m,
                                      int64_t n_head, int64_t hd, const tri__kv_view *kv) {
    // the state is written where out would be, one row of hd + 2 per (query, head): attn_merge
    // folds into out's rows, so it gets a scratch out of its own
    float *o = malloc(sizeof(float) * (size_t)(m * n_head * hd + 1));
    if (!o) return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "cpu attention: state of %lld queries", (long long)m);
    tri_status s = attn_run(be, o, state, NULL, q, q_pos, m, n_head, hd, kv, NULL);
    free(o);
    return s;
}

tri_status tri__cpu_attention_chunks(tri__backend *be, float *chunks, int64_t *n_chunk, const float *q,
                                     const int32_t *q_pos, int64_t m, int64_t n_head, int64_t hd,
                                     const tri__kv_view *kv) {
    int64_t max_keys = 0;
    for (int32_t h = 0; h < kv->n_head_kv; h++) {
        int64_t nh = 0;
        for (int32_t si = kv->head_span[h]; si < kv->head_span[h + 1]; si++) nh += kv->spans[si].n;
        max_keys = nh > max_keys ? nh : max_keys;
    }
    *n_chunk = (max_keys + ATTN_CHUNK - 1) / ATTN_CHUNK;
    if (!chunks) return TRI_STATUS_OK;
    return attn_run(be, NULL, NULL, chunks, q, q_pos, m, n_head, hd, kv, NULL);
}

void tri__cpu_attention_merge(float *out, float *state, const float *chunks, int64_t n_chunk, int64_t rows,
                              int64_t hd) {
    for (int64_t r = 0; r < rows; r++) {
        float *s = state + r * (hd + 2);
        for (int64_t c = 0; c < n_chunk; c++) {
            const float *p = chunks + (c * rows + r) * (hd + 2);
            attn_fold(s, &s[hd], &s[hd + 1], p, p[hd], p[hd + 1], hd);
        }
        float inv = s[hd + 1] > 0 ? 1.0f / s[hd + 1] : 0.0f;  // attn_finish's division
        for (int64_t e = 0; e < hd; e++) out[r * hd + e] = s[e] * inv;
    }
}

// ---- steps driven from backend memory (host memory here) ----

static tri_status cpu_attention_dev(tri__backend *be, float *out, const float *q, const int32_t *q_pos, int64_t m,
                                    int64_t n_head, int64_t hd, const tri__kv_view *kv) {
    return attn_run(be, out, NULL, NULL, q, q_pos, m, n_head, hd, kv, NULL);
}

static tri_status cpu_set_rows(tri__backend *be, void *dst, tri_dtype type, const float *src, const int32_t *rows,
                               int64_t m, int64_t n) {
    if (type != TRI_DTYPE_F32 && type != TRI_DTYPE_F16 && type != TRI_DTYPE_BF16 && type != TRI_DTYPE_Q8_0 &&
        type != TRI_DTYPE_Q4_0)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "cpu set_rows: to %s", tri_dtype_name(type));
    if (m < 0 || n < 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cpu set_rows: %lld rows of %lld", (long long)m, (long long)n);
    for (int64_t i = 0; i < m; i++) {
        if (rows[i] < 0) return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cpu set_rows: row %d at %lld", rows[i], (long long)i);
        TRY(cpu_convert(be, (char *)dst + rows[i] * tri__dtype_row_bytes(type, n), type, src + i * n, n));
    }
    return TRI_STATUS_OK;
}

static tri_status cpu_window_rows(tri__backend *be, int32_t *state, int32_t *rows, int32_t view_rows,
                                  const tri__stream_window *w) {
    (void)be;
    const int32_t n0 = state[1], kept = tri__window_kept(w, n0), own = tri__window_row(w, n0);
    if (n0 < 0 || kept >= view_rows)
        return tri__fail(TRI_STATUS_INVALID_ARGUMENT, "cpu window_rows: a step at %d keeps %d rows, view of %d", n0,
                         kept, view_rows);
    state[2] = kept;
    state[3] = own;
    for (int32_t i = 0; i < view_rows; i++) rows[i] = i < kept ? tri__window_row(w, tri__window_pos(w, n0, i)) : own;
    return TRI_STATUS_OK;
}

// ---- the table ----

static const tri__backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_to_backend = cpu_copy,
    .copy_to_host = cpu_copy,
    .copy = cpu_copy,
    .synchronize = cpu_synchronize,
    .matmul = cpu_matmul,
    .get_rows = cpu_get_rows,
    .convert = cpu_convert,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .softmax = cpu_softmax,
    .top_k = cpu_top_k,
    .attention = cpu_attention,
    .attention_state = cpu_attention_state,
    .gather = cpu_gather,
    .chunk_mean = cpu_chunk_mean,
    .geglu = cpu_geglu,
    .scale = cpu_scale,
    .add_rows = cpu_add_rows,
    .get_rows_dev = cpu_get_rows,
    .rope_dev = cpu_rope,
    .attention_dev = cpu_attention_dev,
    .set_rows = cpu_set_rows,
    .window_rows = cpu_window_rows,
    .caps = TRI_BACKEND_CAP_TREES | TRI_BACKEND_CAP_QUANT_KV | TRI_BACKEND_CAP_TYPED_VIEWS,
};

tri_status tri__cpu_set_attn_bf16(tri__backend *be, bool on) {
    cpu_state *st = cpu_priv(be);
    if (!on) {
        st->kr = st->kr_base;
        return TRI_STATUS_OK;
    }
    if (!tri__cpu_has_bf16())
        return tri__fail(TRI_STATUS_UNSUPPORTED, "cpu backend: bf16 attention scores: this CPU lacks AVX512-BF16");
    st->kr_bf16 = *st->kr_base;
    st->kr_bf16.attn_scores_f16 = tri__cpu_attn_scores_f16_bf16_ref;
#if TRI_CPU_X86
    if (st->simd >= TRI_CPU_SIMD_AVX512) st->kr_bf16.attn_scores_f16 = tri__cpu_attn_scores_f16_bf16;
#endif
    st->kr = &st->kr_bf16;
    return TRI_STATUS_OK;
}

tri_status tri__backend_cpu_create(int32_t n_threads, tri__cpu_simd simd, tri__backend **out) {
    *out = NULL;
    tri__cpu_simd best = tri__cpu_simd_detect();
    if (simd == TRI_CPU_SIMD_AUTO) simd = best;
    if (simd < TRI_CPU_SIMD_SCALAR || simd > best)
        return tri__fail(TRI_STATUS_UNSUPPORTED, "cpu backend: SIMD level %s is not supported by this CPU (best: %s)",
                         tri__cpu_simd_name(simd), tri__cpu_simd_name(best));
    tri__backend *be = calloc(1, sizeof *be);
    cpu_state *st = calloc(1, sizeof *st);
    if (!be || !st) {
        free(be);
        free(st);
        return tri__fail(TRI_STATUS_OUT_OF_MEMORY, "cpu backend: instance");
    }
    st->simd = simd;
    st->kr = &tri__cpu_kernels_scalar;
#if TRI_CPU_X86
    if (simd == TRI_CPU_SIMD_AVX2) st->kr = &tri__cpu_kernels_avx2;
    if (simd == TRI_CPU_SIMD_AVX512) st->kr = &tri__cpu_kernels_avx512;
    if (simd == TRI_CPU_SIMD_AVX512_VNNI) st->kr = &tri__cpu_kernels_avx512_vnni;
#endif
    st->kr_base = st->kr;
    be->ops = &cpu_ops;
    be->n_threads = n_threads > 0 ? n_threads : cpu_max_threads();
    be->host_memory = true;
    // the pool itself is made on the first op that is worth threads (cpu_parallel)
    be->priv = st;
    *out = be;
    return TRI_STATUS_OK;
}
