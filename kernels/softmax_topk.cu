// Softmax + top-k over the last axis of classifier outputs [rows, cols] (float32 or
// float16 in, float32 probabilities and int32 class indices out).
//
// Selection runs on the logits themselves (softmax is monotonic), in one total order:
// larger value first, equal values by smaller index, NaN after every number. So ties
// break by index, and rounding in exp() can never reorder classes. The probability of a
// selected class is expf(x - max) / sum(expf(x_j - max)); with apply_softmax == 0 the
// selected value itself is returned. The NumPy twin (tensord.kernels.classify) performs
// the same selection exactly; its probabilities agree within float32 rounding of exp and
// the sum's order (rtol 1e-5).
//
// Launch: one block of TOPK_THREADS (256) threads per row; grid (rows, 1, 1); dynamic
// shared memory cols * 4 bytes when the row is cached there (cache_row = 1), else 0.
#define TOPK_THREADS 256

__device__ __forceinline__ float f16_bits_to_f32(unsigned short h) {
    float v;
    asm("cvt.f32.f16 %0, %1;" : "=f"(v) : "h"(h));
    return v;
}

__device__ __forceinline__ float load_value(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ float load_value(const unsigned short* p, long long i) {
    return f16_bits_to_f32(p[i]);
}

// True when (va, ia) ranks before (vb, ib).
__device__ __forceinline__ bool ranks_before(float va, int ia, float vb, int ib) {
    bool na = va != va;
    bool nb = vb != vb;
    if (na != nb) return nb;
    if (!na && va != vb) return va > vb;
    return ia < ib;
}

template <typename In>
__device__ void softmax_topk(const In* logits, int rows, int cols, int k, int apply_softmax,
                             int cache_row, int* out_index, float* out_value) {
    extern __shared__ float row_cache[];
    __shared__ float red_v[TOPK_THREADS];
    __shared__ int red_i[TOPK_THREADS];
    int r = blockIdx.x;
    if (r >= rows) return;
    int tid = threadIdx.x;
    const In* row = logits + (long long)r * cols;

    // Pass 1: the row's maximum (NaN ignored), caching the row in shared memory.
    float m = __int_as_float(0xff800000);  // -inf
    for (int j = tid; j < cols; j += TOPK_THREADS) {
        float v = load_value(row, j);
        if (cache_row) row_cache[j] = v;
        m = fmaxf(m, v);
    }
    red_v[tid] = m;
    __syncthreads();
    for (int s = TOPK_THREADS / 2; s > 0; s >>= 1) {
        if (tid < s) red_v[tid] = fmaxf(red_v[tid], red_v[tid + s]);
        __syncthreads();
    }
    m = red_v[0];
    __syncthreads();

    // Pass 2: the softmax denominator.
    float sum = 1.0f;
    if (apply_softmax) {
        float part = 0.0f;
        for (int j = tid; j < cols; j += TOPK_THREADS) {
            float v = cache_row ? row_cache[j] : load_value(row, j);
            part += expf(v - m);
        }
        red_v[tid] = part;
        __syncthreads();
        for (int s = TOPK_THREADS / 2; s > 0; s >>= 1) {
            if (tid < s) red_v[tid] += red_v[tid + s];
            __syncthreads();
        }
        sum = red_v[0];
        __syncthreads();
    }

    // k selections: each the best element ranking after the previous one.
    float prev_v = 0.0f;
    int prev_i = -1;
    for (int sel = 0; sel < k; ++sel) {
        float best_v = 0.0f;
        int best_i = -1;
        for (int j = tid; j < cols; j += TOPK_THREADS) {
            float v = cache_row ? row_cache[j] : load_value(row, j);
            if (prev_i >= 0 && !ranks_before(prev_v, prev_i, v, j)) continue;
            if (best_i < 0 || ranks_before(v, j, best_v, best_i)) {
                best_v = v;
                best_i = j;
            }
        }
        red_v[tid] = best_v;
        red_i[tid] = best_i;
        __syncthreads();
        for (int s = TOPK_THREADS / 2; s > 0; s >>= 1) {
            if (tid < s) {
                int oi = red_i[tid + s];
                if (oi >= 0 && (red_i[tid] < 0 || ranks_before(red_v[tid + s], oi, red_v[tid],
                                                               red_i[tid]))) {
                    red_v[tid] = red_v[tid + s];
                    red_i[tid] = oi;
                }
            }
            __syncthreads();
        }
        prev_v = red_v[0];
        prev_i = red_i[0];
        if (tid == 0) {
            long long o = (long long)r * k + sel;
            out_index[o] = prev_i;
            out_value[o] = apply_softmax ? expf(prev_v - m) / sum : prev_v;
        }
        __syncthreads();
    }
}

extern "C" __global__ void softmax_topk_f32(const float* logits, int rows, int cols, int k,
                                            int apply_softmax, int cache_row, int* out_index,
                                            float* out_value) {
    softmax_topk(logits, rows, cols, k, apply_softmax, cache_row, out_index, out_value);
}

extern "C" __global__ void softmax_topk_f16(const unsigned short* logits, int rows, int cols,
                                            int k, int apply_softmax, int cache_row,
                                            int* out_index, float* out_value) {
    softmax_topk(logits, rows, cols, k, apply_softmax, cache_row, out_index, out_value);
}
