// Paged KV cache gather and scatter for the generation engine.
//
// The pool for one layer's keys (or values) is pool[num_blocks, H, block_size, D]; block
// j of a sequence's block table holds its positions [j * block_size, (j + 1) * block_size).
//
// Gather (block tables -> contiguous past, right-aligned: zero-padded on the left, so every
// sequence's last cached position is column P - 1 and the step's new tokens follow it):
//     out[b, h, P - seq_lens[b] + t, :] = pool[tables[b, t / bs], h, t % bs, :]  for t < seq_lens[b]
//     out[b, h, c, :] = 0                                              for c < P - seq_lens[b]
// Scatter (new keys/values -> pool blocks):
//     for t < num_new[b]: p = start_pos[b] + t
//         pool[tables[b, p / bs], h, p % bs, :] = new[b, h, t, :]
// The host checks every table entry it will use (tensord.kernels.kv); a block id out of
// range is skipped here (gather writes zeros) so a bad table never faults the device.
//
// The element type does not matter: a row of D elements is copied as `vpr` vectors of
// V = 16, 8, 4, 2 or 1 bytes, the widest that divides the row and the pointers.
// Launch: block (256, 1, 1); grid (ceil(P * vpr / 256), min(B * H, 65535), 1) for gather,
// the same with T (the new tensor's third dimension) for scatter.


template <typename V>
__device__ __forceinline__ V zero_value() {
    V v;
    unsigned char* p = reinterpret_cast<unsigned char*>(&v);
#pragma unroll
    for (int i = 0; i < (int)sizeof(V); ++i) p[i] = 0;
    return v;
}

template <typename V>
__device__ void kv_gather(const V* pool, const int* tables, const int* seq_lens, V* out, int B,
                          int H, int P, int vpr, int block_size, int max_blocks,
                          int num_blocks) {
    const int row_vectors = P * vpr;  // the host keeps P * vpr below 2^30
    for (long long bh = blockIdx.y; bh < (long long)B * H; bh += gridDim.y) {
        int b = (int)(bh / H);
        int h = (int)(bh % H);
        int pad = P - seq_lens[b];
        V* dst = out + bh * (long long)row_vectors;
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < row_vectors;
             i += gridDim.x * blockDim.x) {
            int c = i / vpr;
            int v = i - c * vpr;
            int t = c - pad;
            V value = zero_value<V>();
            if (t >= 0) {
                int slot = t / block_size;
                int blk = slot < max_blocks ? tables[(long long)b * max_blocks + slot] : -1;
                if (blk >= 0 && blk < num_blocks) {
                    long long src = (((long long)blk * H + h) * block_size + (t - slot * block_size));
                    value = pool[src * vpr + v];
                }
            }
            dst[i] = value;
        }
    }
}

template <typename V>
__device__ void kv_scatter(const V* fresh, const int* tables, const int* start_pos,
                           const int* num_new, V* pool, int B, int H, int T, int vpr,
                           int block_size, int max_blocks, int num_blocks) {
    const int row_vectors = T * vpr;  // the host keeps T * vpr below 2^30
    for (long long bh = blockIdx.y; bh < (long long)B * H; bh += gridDim.y) {
        int b = (int)(bh / H);
        int h = (int)(bh % H);
        int count = num_new[b];
        int start = start_pos[b];
        const V* src = fresh + bh * (long long)row_vectors;
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < row_vectors;
             i += gridDim.x * blockDim.x) {
            int t = i / vpr;
            if (t >= count) continue;
            int v = i - t * vpr;
            int p = start + t;
            int slot = p / block_size;
            int blk = slot < max_blocks ? tables[(long long)b * max_blocks + slot] : -1;
            if (blk < 0 || blk >= num_blocks) continue;
            long long dst = (((long long)blk * H + h) * block_size + (p - slot * block_size));
            pool[dst * vpr + v] = src[i];
        }
    }
}

#define KV_ENTRY_POINTS(SUFFIX, V)                                                           \
    extern "C" __global__ void kv_gather_##SUFFIX(                                            \
        const V* pool, const int* tables, const int* seq_lens, V* out, int B, int H, int P,   \
        int vpr, int block_size, int max_blocks, int num_blocks) {                            \
        kv_gather(pool, tables, seq_lens, out, B, H, P, vpr, block_size, max_blocks,          \
                  num_blocks);                                                                \
    }                                                                                         \
    extern "C" __global__ void kv_scatter_##SUFFIX(                                           \
        const V* fresh, const int* tables, const int* start_pos, const int* num_new, V* pool, \
        int B, int H, int T, int vpr, int block_size, int max_blocks, int num_blocks) {       \
        kv_scatter(fresh, tables, start_pos, num_new, pool, B, H, T, vpr, block_size,         \
                   max_blocks, num_blocks);                                                   \
    }

KV_ENTRY_POINTS(v16, uint4)
KV_ENTRY_POINTS(v8, uint2)
KV_ENTRY_POINTS(v4, unsigned int)
KV_ENTRY_POINTS(v2, unsigned short)
KV_ENTRY_POINTS(v1, unsigned char)
