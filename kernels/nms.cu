// Non-maximum suppression for detector outputs, per class, one image per block.
//
// Inputs: boxes [n, num_boxes, 4] float32 (xyxy corners, or cx, cy, w, h), scores
// [n, num_boxes, num_classes] float32. Outputs: out_boxes [n, max_det, 4] (xyxy),
// out_scores [n, max_det], out_classes [n, max_det] int32, out_count [n] int32; slots
// past the count hold boxes 0, score 0, class -1.
//
// 1. Candidates are the (box, class) pairs with score > score_threshold. They are ordered
//    by score, higher first, then by flat index box * num_classes + class, lower first
//    (ties break by index), and only the first `max_candidates` (<= NMS_CAP) are kept.
// 2. Greedy, in that order: a candidate is kept unless a kept candidate of the same class
//    overlaps it with IoU > iou_threshold. The first max_det kept are written.
// Boxes are made canonical (x1 = min, x2 = max) before use; for two boxes
//     iw = min(ax2, bx2) - max(ax1, bx1);  ih = likewise in y
//     inter = (iw > 0 && ih > 0) ? iw * ih : 0
//     area = (x2 - x1) * (y2 - y1);  union = (area_a + area_b) - inter
//     iou = union > 0 ? inter / union : 0
// Every step is one IEEE float32 operation: compiled with --fmad=false the decisions are
// exactly those of the NumPy twin (tensord.kernels.nms). Written boxes are mapped back
// by (x - map_ox) / map_sx, (y - map_oy) / map_sy (letterbox offsets and scales; 0 and 1
// leave them as they are).
//
// Candidate selection is deterministic: the pairs are scanned in index order and
// compacted with a block-wide prefix count; whenever the fresh half of a 2 * NMS_CAP key
// buffer fills, the whole buffer is bitonic-sorted (descending) and its best NMS_CAP keys
// kept. A key is (order-preserving score bits << 32) | (0xFFFFFFFF - flat index), unique
// per pair, so the kept set does not depend on the scan's chunking.
//
// Launch: block (NMS_THREADS, 1, 1); grid (n, 1, 1); no dynamic shared memory.
#define NMS_THREADS 512
#define NMS_CAP 2048
#define NMS_PER_THREAD (NMS_CAP / NMS_THREADS)

__device__ __forceinline__ unsigned int order_bits(float s) {
    s = s + 0.0f;  // -0 becomes +0: equal scores must share their bits
    unsigned int u = __float_as_uint(s);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Bitonic sort of keys[0, 2 * NMS_CAP), descending.
__device__ void sort_keys_desc(unsigned long long* keys) {
    const int n = 2 * NMS_CAP;
    for (int size = 2; size <= n; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int t = threadIdx.x; t < n / 2; t += NMS_THREADS) {
                int lo = 2 * t - (t & (stride - 1));
                int hi = lo + stride;
                bool descending = (lo & size) == 0;
                unsigned long long a = keys[lo];
                unsigned long long b = keys[hi];
                if ((a < b) == descending) {
                    keys[lo] = b;
                    keys[hi] = a;
                }
            }
            __syncthreads();
        }
    }
}

__device__ __forceinline__ void canonical_box(const float* b, int box_format, float* x1,
                                              float* y1, float* x2, float* y2) {
    float a0 = b[0], a1 = b[1], a2 = b[2], a3 = b[3];
    if (box_format == 1) {  // cx, cy, w, h
        float hw = a2 * 0.5f;
        float hh = a3 * 0.5f;
        float cx = a0, cy = a1;
        a0 = cx - hw;
        a1 = cy - hh;
        a2 = cx + hw;
        a3 = cy + hh;
    }
    *x1 = fminf(a0, a2);
    *x2 = fmaxf(a0, a2);
    *y1 = fminf(a1, a3);
    *y2 = fmaxf(a1, a3);
}

extern "C" __global__ void nms_per_class(const float* boxes, const float* scores, int num_boxes,
                                         int num_classes, int box_format, float score_threshold,
                                         float iou_threshold, int max_candidates, int max_det,
                                         float map_ox, float map_oy, float map_sx,
                                         float map_sy, float* out_boxes, float* out_scores, int* out_classes,
                                         int* out_count) {
    __shared__ unsigned long long keys[2 * NMS_CAP];
    __shared__ int warp_counts[NMS_THREADS / 32];
    __shared__ int fresh_count;
    __shared__ unsigned char removed[NMS_CAP];
    __shared__ float cur[5];
    __shared__ int cur_class;

    const int tid = threadIdx.x;
    const long long img = blockIdx.x;
    const long long total = (long long)num_boxes * num_classes;
    const float* img_scores = scores + img * total;
    const float* img_boxes = boxes + img * (long long)num_boxes * 4;
    const int cap = min(max_candidates, NMS_CAP);

    for (int i = tid; i < 2 * NMS_CAP; i += NMS_THREADS) keys[i] = 0ull;
    if (tid == 0) fresh_count = 0;
    __syncthreads();
    int best_count = 0;

    // 1. Candidate selection: the fresh half is keys[NMS_CAP, 2 * NMS_CAP).
    for (long long base = 0; base < total; base += NMS_THREADS) {
        if (fresh_count + NMS_THREADS > NMS_CAP) {
            best_count = min(best_count + fresh_count, NMS_CAP);
            sort_keys_desc(keys);
            for (int i = NMS_CAP + tid; i < 2 * NMS_CAP; i += NMS_THREADS) keys[i] = 0ull;
            if (tid == 0) fresh_count = 0;
            __syncthreads();
        }
        long long flat = base + tid;
        float s = flat < total ? img_scores[flat] : 0.0f;
        bool is_candidate = flat < total && s > score_threshold;
        unsigned int ballot = __ballot_sync(0xffffffffu, is_candidate);
        int lane = tid & 31;
        int warp = tid >> 5;
        if (lane == 0) warp_counts[warp] = __popc(ballot);
        __syncthreads();
        int before = fresh_count;
        for (int w = 0; w < warp; ++w) before += warp_counts[w];
        before += __popc(ballot & ((1u << lane) - 1u));
        if (is_candidate) {
            unsigned long long key = ((unsigned long long)order_bits(s) << 32) |
                                     (unsigned long long)(0xFFFFFFFFu - (unsigned int)flat);
            keys[NMS_CAP + before] = key;
        }
        __syncthreads();
        if (tid == 0) {
            int added = 0;
            for (int w = 0; w < NMS_THREADS / 32; ++w) added += warp_counts[w];
            fresh_count += added;
        }
        __syncthreads();
    }
    if (fresh_count > 0) {
        best_count = min(best_count + fresh_count, NMS_CAP);
        sort_keys_desc(keys);
    }
    const int n = min(best_count, cap);

    // 2. Each thread holds candidates tid + r * NMS_THREADS in registers.
    float bx1[NMS_PER_THREAD], by1[NMS_PER_THREAD], bx2[NMS_PER_THREAD], by2[NMS_PER_THREAD];
    float barea[NMS_PER_THREAD];
    int bcls[NMS_PER_THREAD];
#pragma unroll
    for (int r = 0; r < NMS_PER_THREAD; ++r) {
        int i = tid + r * NMS_THREADS;
        bcls[r] = -1;
        bx1[r] = by1[r] = bx2[r] = by2[r] = barea[r] = 0.0f;
        if (i < n) {
            unsigned int flat = 0xFFFFFFFFu - (unsigned int)(keys[i] & 0xFFFFFFFFull);
            int b = flat / num_classes;
            bcls[r] = flat % num_classes;
            canonical_box(img_boxes + (long long)b * 4, box_format, &bx1[r], &by1[r], &bx2[r],
                          &by2[r]);
            barea[r] = (bx2[r] - bx1[r]) * (by2[r] - by1[r]);
        }
        if (i < NMS_CAP) removed[i] = 0;
    }
    __syncthreads();

    // 3. Greedy suppression in candidate order.
    int kept = 0;
    float* ob = out_boxes + img * (long long)max_det * 4;
    float* os = out_scores + img * (long long)max_det;
    int* oc = out_classes + img * (long long)max_det;
    for (int i = 0; i < n && kept < max_det; ++i) {
        if (removed[i]) continue;  // uniform: written before the last barrier
        if (tid == (i % NMS_THREADS)) {
            unsigned int flat = 0xFFFFFFFFu - (unsigned int)(keys[i] & 0xFFFFFFFFull);
#pragma unroll
            for (int r = 0; r < NMS_PER_THREAD; ++r) {
                if (r != i / NMS_THREADS) continue;  // constant indices keep the arrays in registers
                cur[0] = bx1[r];
                cur[1] = by1[r];
                cur[2] = bx2[r];
                cur[3] = by2[r];
                cur[4] = barea[r];
                cur_class = bcls[r];
                ob[kept * 4 + 0] = (bx1[r] - map_ox) / map_sx;
                ob[kept * 4 + 1] = (by1[r] - map_oy) / map_sy;
                ob[kept * 4 + 2] = (bx2[r] - map_ox) / map_sx;
                ob[kept * 4 + 3] = (by2[r] - map_oy) / map_sy;
                os[kept] = img_scores[flat];
                oc[kept] = bcls[r];
            }
        }
        __syncthreads();
        float cx1 = cur[0], cy1 = cur[1], cx2 = cur[2], cy2 = cur[3], carea = cur[4];
        int ccls = cur_class;
#pragma unroll
        for (int r = 0; r < NMS_PER_THREAD; ++r) {
            int j = tid + r * NMS_THREADS;
            if (j <= i || j >= n || bcls[r] != ccls || removed[j]) continue;
            float iw = fminf(cx2, bx2[r]) - fmaxf(cx1, bx1[r]);
            float ih = fminf(cy2, by2[r]) - fmaxf(cy1, by1[r]);
            float inter = (iw > 0.0f && ih > 0.0f) ? iw * ih : 0.0f;
            float uni = (carea + barea[r]) - inter;
            float iou = uni > 0.0f ? inter / uni : 0.0f;
            if (iou > iou_threshold) removed[j] = 1;
        }
        ++kept;
        __syncthreads();
    }

    // 4. Padding and the count.
    for (int slot = kept + tid; slot < max_det; slot += NMS_THREADS) {
        ob[slot * 4 + 0] = 0.0f;
        ob[slot * 4 + 1] = 0.0f;
        ob[slot * 4 + 2] = 0.0f;
        ob[slot * 4 + 3] = 0.0f;
        os[slot] = 0.0f;
        oc[slot] = -1;
    }
    if (tid == 0) out_count[img] = kept;
}
