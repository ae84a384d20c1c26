// Fused image preprocessing: uint8 HWC images (RGB or BGR) -> bilinear resize ->
// per-channel (v - mean) * inv_std -> float32 or float16, NCHW or NHWC, batched.
//
// The resize follows OpenCV's INTER_LINEAR with half-pixel centres; image_common.cuh
// states the exact arithmetic, which tensord.kernels.image.resize_normalize repeats in
// NumPy. Compile with --fmad=false for bit-identical results.
//
// Launch: block (BLOCK_X, 1, 1); grid (ceil(dst_w / BLOCK_X), dst_h, n). One thread per
// output pixel writes its three channels; consecutive threads write consecutive x, so
// NCHW stores are coalesced.
#include "image_common.cuh"

template <typename Out>
__device__ void resize_normalize(const unsigned char* src, int src_h, int src_w, long long row,
                                 long long image_stride, int dst_h, int dst_w, float scale_x,
                                 float scale_y, Normalise nm, Out* out, long long s_n,
                                 long long s_c, long long s_y, long long s_x) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y;
    long long n = blockIdx.z;
    if (x >= dst_w || y >= dst_h) return;
    sample_store(src + n * image_stride, src_h, src_w, row, x, y, scale_x, scale_y, nm,
                 out + n * s_n + y * s_y + x * s_x, s_c);
}

extern "C" __global__ void resize_normalize_f32(
    const unsigned char* src, int src_h, int src_w, long long row, long long image_stride,
    int dst_h, int dst_w, float scale_x, float scale_y, Normalise nm, float* out,
    long long s_n, long long s_c, long long s_y, long long s_x) {
    resize_normalize(src, src_h, src_w, row, image_stride, dst_h, dst_w, scale_x, scale_y, nm,
                     out, s_n, s_c, s_y, s_x);
}

extern "C" __global__ void resize_normalize_f16(
    const unsigned char* src, int src_h, int src_w, long long row, long long image_stride,
    int dst_h, int dst_w, float scale_x, float scale_y, Normalise nm, unsigned short* out,
    long long s_n, long long s_c, long long s_y, long long s_x) {
    resize_normalize(src, src_h, src_w, row, image_stride, dst_h, dst_w, scale_x, scale_y, nm,
                     out, s_n, s_c, s_y, s_x);
}
