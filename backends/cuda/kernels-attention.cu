// kernels-attention.cu - attention over a KV view, split along the keys (flash-decoding).
//
// The keys of each KV head (its spans, in order) are cut into chunks of at most chunk_keys. Pass
// 1: one block per (chunk, query) scores the chunk's visible keys for the query heads of the
// group, and writes the chunk's max, sum of exp(score - max) and the exp-weighted sum of values.
// Pass 2: one block per (query, query head) combines the chunks of its KV head. Pass 3 (only for
// weight_sums): one block per chunk recomputes every score with the same warp_dot and adds
// exp(score - max) / sum over the group's heads and the queries. Scratch is per chunk, so a 128K
// key view costs (keys / chunk_keys) partial rows per query head, not one score per key. Rows are
// F32, F16, or the blocks of a quantized cache (Q8_0, Q4_0), dequantized in registers as read; a
// view whose spans carry their own types (a retrieval cache's quantized chunks beside its f16
// ring, kv_type mixed) is cut into chunks of one type each, and each type's chunks are one launch
// of passes 1 and 3 (the combine does not read rows).
#include <math.h>

#include "cuda-common.cuh"

#define ATTN_THREADS 128
#define ATTN_WARPS (ATTN_THREADS / 32)

// The cache's row types as template arguments: F32, F16, and the blocks of 32 of Q8_0 (f16 scale,
// 32 int8) and Q4_0 (f16 scale, 16 bytes of nibbles), which are read where they lie: each thread
// dequantizes the elements it uses into registers (d q, d (q - 8): the values tri__dequantize_row
// gives, exact in f32), so no f16 or f32 copy of a quantized cache is ever made.
enum { KV_F32 = TRI_CUDA_KV_F32, KV_F16 = TRI_CUDA_KV_F16, KV_Q8_0 = TRI_CUDA_KV_Q8_0, KV_Q4_0 = TRI_CUDA_KV_Q4_0 };

// Bytes of n elements of a row (n a multiple of 32 for the block types).
template <int KT>
__device__ __forceinline__ size_t kv_bytes(int64_t n) {
    return KT == KV_F32 ? (size_t)n * 4 : KT == KV_F16 ? (size_t)n * 2 : (size_t)(n / 32) * (KT == KV_Q8_0 ? 34 : 18);
}

// Key or value row element d.
template <int KT>
__device__ __forceinline__ float kv_elem(const void *row, int64_t d) {
    if (KT == KV_F32) return ((const float *)row)[d];
    if (KT == KV_F16) return tri_dev_f16_to_f32(((const uint16_t *)row)[d]);
    const int e = (int)(d & 31);
    const uint8_t *blk = (const uint8_t *)row + (d >> 5) * (KT == KV_Q8_0 ? 34 : 18);
    const float scale = tri_dev_f16_to_f32(*(const uint16_t *)blk);  // blocks are 2-byte aligned
    if (KT == KV_Q8_0) return scale * (float)(int8_t)blk[2 + e];
    const int q = e < 16 ? blk[2 + e] & 15 : blk[2 + e - 16] >> 4;
    return scale * (float)(q - 8);
}

// q . krow over hd elements, by a whole warp; every lane gets the same value (a butterfly sum of
// the same operands). Explicit fmaf and __fmul_rn so that pass 1 and pass 3 compute bit-identical
// scores whatever the compiler contracts (unrolling changes no operation's order).
template <int KT, int UNROLL = (KT == KV_F32 ? 4 : 2)>
__device__ __forceinline__ float warp_score(const float *q, const void *krow, int64_t hd, float scale, int lane) {
    float s = 0.0f;
    // Unrolled by 2 for f16 and block rows and 4 for f32; in k_attn_weight_sums q8_0 rows as
    // WS_Q8_UNROLL says and q4_0 rows by 4: other choices (the compiler's own among them) make ptxas spill in
    // k_attn_weight_sums, f16 on sm_80, f32 on sm_120, q8_0 and q4_0 by 2 on sm_80 or sm_90, q4_0
    // by 1 on sm_80 (scripts/check-cuda.py fails on any spill). A lane reads element lane of each block of 32: a
    // warp reads a block's codes in one stretch and its scale once.
#pragma unroll(UNROLL)
    for (int64_t d = lane; d < hd; d += 32) s = fmaf(q[d], kv_elem<KT>(krow, d), s);
    for (int o = 16; o > 0; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
    return __fmul_rn(s, scale);
}

// The attention-logit soft-cap (Gemma 2) of a scaled score: cap * tanh(s / cap); cap 0: s. The
// same expression in the score pass and the weight sums' pass, so they agree to the bit.
__device__ __forceinline__ float soft_cap(float s, float cap) {
    return cap > 0.0f ? __fmul_rn(cap, tanhf(__fdiv_rn(s, cap))) : s;
}

// The span holding key (an index among all keys of the view) among the spans of KV head h: the
// last span whose first key is <= key (empty spans share their first key with the next one).
__device__ __forceinline__ int32_t find_span(const tri__cuda_attn_args &a, int32_t h, int64_t key) {
    int32_t lo = a.head_span[h], hi = a.head_span[h + 1];
    while (hi - lo > 1) {
        int32_t mid = lo + (hi - lo) / 2;
        if (a.spans[mid].key0 <= key) lo = mid;
        else hi = mid;
    }
    return lo;
}

__device__ __forceinline__ int32_t key_pos(const tri__cuda_attn_args &a, const tri__cuda_span &sp, int64_t r) {
    return sp.pos_at >= 0 ? a.pos[sp.pos_at + r] : sp.pos0 + (int32_t)r;
}

// Whether query position qp sees key position kp: the causal rule, and among a tree's nodes the
// tree's (tri__kv_tree_sees).
__device__ __forceinline__ bool key_visible(const tri__cuda_attn_args &a, int32_t qp, int32_t kp) {
    if (kp > qp) return false;
    if (a.tree_n == 0 || kp < a.tree_row0 || qp >= a.tree_row0 + a.tree_n) return true;
    int32_t r = qp - a.tree_row0, c = kp - a.tree_row0;
    return (a.tree_anc[(int64_t)r * a.tree_words + c / 32] >> (c % 32)) & 1u;
}

static __host__ __device__ size_t align8(size_t n) { return (n + 7) / 8 * 8; }

// Shared memory of pass 1: q (group, hd) f32 | scores (group, C) f32 | key and value row
// pointers (C each) | visibility (C bytes).
size_t tri__cuda_attn_smem(int64_t group, int64_t hd, int32_t chunk_keys) {
    size_t C = (size_t)chunk_keys;
    size_t bytes = align8(sizeof(float) * (size_t)(group * hd)) + align8(sizeof(float) * (size_t)group * C) +
                   2 * sizeof(void *) * C + C;
    return bytes > 48 * 1024 - 256 ? 0 : bytes;  // 48 KiB per block without opting in, less n_vis
}

// Blocks (chunk ids[b / mt], or b / mt with ids NULL; query i0 + b % mt): chunks of rows of type KT.
template <int KT>
__global__ void __launch_bounds__(ATTN_THREADS) k_attn_partial(tri__cuda_attn_args a, const int32_t *ids, int64_t i0,
                                                               int64_t mt) {
    TRI_DYN_SMEM(unsigned char, smem);
    const int64_t g = a.group, hd = a.hd, C = a.chunk_keys;
    float *qs = (float *)smem;
    float *sc = (float *)(smem + align8(sizeof(float) * (size_t)(g * hd)));
    const void **kp = (const void **)((unsigned char *)sc + align8(sizeof(float) * (size_t)(g * C)));
    const void **vp = kp + C;
    unsigned char *vis = (unsigned char *)(vp + C);
    __shared__ int n_vis;

    const int64_t blk = blockIdx.x, iq = blk % mt, i = i0 + iq;
    const int64_t c = ids ? ids[blk / mt] : blk / mt;
    const tri__cuda_chunk ch = a.chunks[c];
    const int32_t h = ch.head, n = ch.n;
    const int32_t qpos = a.q_pos[i];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) n_vis = 0;
    __syncthreads();

    for (int32_t t = threadIdx.x; t < n; t += ATTN_THREADS) {
        int64_t key = ch.key0 + t;
        const tri__cuda_span &sp = a.spans[find_span(a, h, key)];
        int64_t r = key - sp.key0;
        vis[t] = key_visible(a, qpos, key_pos(a, sp, r));
        if (vis[t]) atomicAdd(&n_vis, 1);
        kp[t] = (const unsigned char *)sp.k + kv_bytes<KT>(r * sp.stride);
        vp[t] = (const unsigned char *)sp.v + kv_bytes<KT>(r * sp.stride);
    }
    const float *qg = a.q + (i * a.n_head + (int64_t)h * g) * hd;  // the group's g heads, contiguous
    for (int64_t e = threadIdx.x; e < g * hd; e += ATTN_THREADS) qs[e] = qg[e];
    __syncthreads();

    float *o = a.part_o + ((c * mt + iq) * g) * hd;
    float *ml = a.part_ml + ((c * mt + iq) * g) * 2;
    if (n_vis == 0) {  // nothing visible in this chunk (uniform): an empty partial
        for (int64_t e = threadIdx.x; e < g * hd; e += ATTN_THREADS) o[e] = 0.0f;
        for (int64_t e = threadIdx.x; e < g; e += ATTN_THREADS) ml[2 * e] = -INFINITY, ml[2 * e + 1] = 0.0f;
        return;
    }

    // scores: one warp per key, lanes along head_dim
    for (int32_t t = warp; t < n; t += ATTN_WARPS) {
        if (!vis[t]) continue;  // uniform within the warp
        for (int64_t aa = 0; aa < g; aa++) {
            float s = soft_cap(warp_score<KT>(qs + aa * hd, kp[t], hd, a.scale, lane), a.softcap);
            if (lane == 0) sc[aa * C + t] = s;
        }
    }
    __syncthreads();

    // per query head: chunk max, probabilities (unnormalised) in place, their sum
    for (int64_t aa = warp; aa < g; aa += ATTN_WARPS) {
        float *s = sc + aa * C;
        float mx = -INFINITY;
        for (int32_t t = lane; t < n; t += 32)
            if (vis[t]) mx = fmaxf(mx, s[t]);
        for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        float sum = 0.0f;
        for (int32_t t = lane; t < n; t += 32) {
            float p = vis[t] ? expf(s[t] - mx) : 0.0f;  // mx is finite: some key is visible
            s[t] = p;
            sum += p;
        }
        for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        if (lane == 0) ml[2 * aa] = mx, ml[2 * aa + 1] = sum;
    }
    __syncthreads();

    // exp-weighted values: one thread per (head of the group, element), reading rows coalesced
    for (int64_t e = threadIdx.x; e < g * hd; e += ATTN_THREADS) {
        int64_t aa = e / hd, d = e % hd;
        const float *p = sc + aa * C;
        float acc = 0.0f;
        for (int32_t t = 0; t < n; t++)
            if (vis[t]) acc = fmaf(p[t], kv_elem<KT>(vp[t], d), acc);  // masked rows are never read
        o[e] = acc;
    }
}

// One block per (query of the tile, query head).
__global__ void __launch_bounds__(ATTN_THREADS) k_attn_combine(float *out, tri__cuda_attn_args a, int64_t i0, int64_t mt) {
    const int64_t blk = blockIdx.x, iq = blk / a.n_head, hq = blk % a.n_head, i = i0 + iq;
    const int64_t g = a.group, hd = a.hd, h = hq / g, aa = hq % g;
    const int32_t c0 = a.head_chunk[h], c1 = a.head_chunk[h + 1];
    float M = -INFINITY;
    for (int32_t c = c0; c < c1; c++) {
        const float *ml = a.part_ml + ((c * mt + iq) * g + aa) * 2;
        if (ml[1] > 0) M = fmaxf(M, ml[0]);
    }
    float L = 0.0f;
    for (int32_t c = c0; c < c1; c++) {
        const float *ml = a.part_ml + ((c * mt + iq) * g + aa) * 2;
        if (ml[1] > 0) L += expf(ml[0] - M) * ml[1];
    }
    float *dst = out + (i * a.n_head + hq) * hd;
    for (int64_t d = threadIdx.x; d < hd; d += ATTN_THREADS) {
        float acc = 0.0f;
        for (int32_t c = c0; c < c1; c++) {
            const float *ml = a.part_ml + ((c * mt + iq) * g + aa) * 2;
            if (ml[1] > 0) acc += expf(ml[0] - M) * a.part_o[((c * mt + iq) * g + aa) * hd + d];
        }
        if (a.state) a.state[(i * a.n_head + hq) * (hd + 2) + d] = acc;  // the state: no division
        else dst[d] = L > 0 ? acc / L : 0.0f;  // a query that sees no key gets zeros
    }
    if (a.state && threadIdx.x == 0) {
        a.state[(i * a.n_head + hq) * (hd + 2) + hd] = M;
        a.state[(i * a.n_head + hq) * (hd + 2) + hd + 1] = L;
    }
    if (threadIdx.x == 0) {
        a.stats[(i * a.n_head + hq) * 2] = M;
        a.stats[(i * a.n_head + hq) * 2 + 1] = L;
    }
}

// q8_0 rows in k_attn_weight_sums are unrolled by 8 on sm_86 and sm_89 and by 2 elsewhere: with the
// soft-cap's tanhf in the loop every other choice makes ptxas spill on one of them
// (scripts/check-cuda.py).
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 890)
#define WS_Q8_UNROLL 8
#else
#define WS_Q8_UNROLL 2
#endif

// One block per chunk (ids[b], or b with ids NULL) of rows of type KT (any of the four: kv_type
// mixed's heavy hitters are H2O's scores over q4_0 rows beside f16 ones).
template <int KT>
__global__ void __launch_bounds__(ATTN_THREADS) k_attn_weight_sums(float *ws, tri__cuda_attn_args a,
                                                                   const int32_t *ids) {
    const tri__cuda_chunk ch = a.chunks[ids ? ids[blockIdx.x] : blockIdx.x];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t g = a.group, hd = a.hd;
    for (int32_t t = warp; t < ch.n; t += ATTN_WARPS) {
        int64_t key = ch.key0 + t;
        const tri__cuda_span &sp = a.spans[find_span(a, ch.head, key)];
        int64_t r = key - sp.key0;
        int32_t kpos = key_pos(a, sp, r);
        const void *krow = (const unsigned char *)sp.k + kv_bytes<KT>(r * sp.stride);
        double w = 0;
        for (int64_t i = 0; i < a.m; i++) {
            if (!key_visible(a, a.q_pos[i], kpos)) continue;  // uniform within the warp
            for (int64_t aa = 0; aa < g; aa++) {
                int64_t qa = i * a.n_head + (int64_t)ch.head * g + aa;
                float s = soft_cap(warp_score<KT, KT == KV_Q8_0 ? WS_Q8_UNROLL : (KT == KV_F32 || KT == KV_Q4_0 ? 4 : 2)>(
                                       a.q + qa * hd, krow, hd, a.scale, lane),
                                   a.softcap);
                w += (double)(expf(s - a.stats[2 * qa]) / a.stats[2 * qa + 1]);
            }
        }
        if (lane == 0) ws[key] = (float)w;
    }
}

// The chunk ids of kind k for a launch (NULL: 0 .. kind_n[k] - 1).
static const int32_t *kind_ids(const tri__cuda_attn_args *a, int k) {
    return a->chunk_order ? a->chunk_order + a->kind_0[k] : NULL;
}

cudaError_t tri__cuda_attention(float *out, const tri__cuda_attn_args *a, int64_t i0, int64_t mt, cudaStream_t s) {
    if (mt <= 0) return cudaSuccess;
    size_t smem = tri__cuda_attn_smem(a->group, a->hd, a->chunk_keys);
    int64_t blocks2 = mt * a->n_head;
    if (smem == 0 || a->n_chunks * mt > 0x7fffffff || blocks2 > 0x7fffffff) return cudaErrorInvalidValue;
    for (int k = 0; k < TRI_CUDA_KV_KINDS; k++) {
        if (a->kind_n[k] <= 0) continue;
        const unsigned int nb = (unsigned int)(a->kind_n[k] * mt);
        const int32_t *ids = kind_ids(a, k);
        switch (k) {
        case KV_F16: TRI_LAUNCH((k_attn_partial<KV_F16>), nb, ATTN_THREADS, smem, s, *a, ids, i0, mt); break;
        case KV_Q8_0: TRI_LAUNCH((k_attn_partial<KV_Q8_0>), nb, ATTN_THREADS, smem, s, *a, ids, i0, mt); break;
        case KV_Q4_0: TRI_LAUNCH((k_attn_partial<KV_Q4_0>), nb, ATTN_THREADS, smem, s, *a, ids, i0, mt); break;
        default: TRI_LAUNCH((k_attn_partial<KV_F32>), nb, ATTN_THREADS, smem, s, *a, ids, i0, mt); break;
        }
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    }
    TRI_LAUNCH((k_attn_combine), (unsigned int)blocks2, ATTN_THREADS, 0, s, out, *a, i0, mt);
    return cudaGetLastError();
}

cudaError_t tri__cuda_attn_weight_sums(float *weight_sums, const tri__cuda_attn_args *a, cudaStream_t s) {
    if (a->n_chunks <= 0) return cudaSuccess;
    if (a->n_chunks > 0x7fffffff) return cudaErrorInvalidValue;
    for (int k = 0; k < TRI_CUDA_KV_KINDS; k++) {
        if (a->kind_n[k] <= 0) continue;
        const unsigned int nb = (unsigned int)a->kind_n[k];
        const int32_t *ids = kind_ids(a, k);
        switch (k) {
        case KV_F16: TRI_LAUNCH((k_attn_weight_sums<KV_F16>), nb, ATTN_THREADS, 0, s, weight_sums, *a, ids); break;
        case KV_Q8_0: TRI_LAUNCH((k_attn_weight_sums<KV_Q8_0>), nb, ATTN_THREADS, 0, s, weight_sums, *a, ids); break;
        case KV_Q4_0: TRI_LAUNCH((k_attn_weight_sums<KV_Q4_0>), nb, ATTN_THREADS, 0, s, weight_sums, *a, ids); break;
        default: TRI_LAUNCH((k_attn_weight_sums<KV_F32>), nb, ATTN_THREADS, 0, s, weight_sums, *a, ids); break;
        }
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
}
