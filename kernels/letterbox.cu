// Letterbox preprocessing for detectors: keep the aspect ratio, resize into a centred
// region of the output, pad the rest with a given pixel value, normalise, and write
// float32 or float16 NCHW/NHWC.
//
// The host computes the geometry (tensord.kernels.image.letterbox_geometry):
//     r     = min(dst_w / src_w, dst_h / src_h)
//     new_w = clamp(floor(src_w * r + 0.5), 1, dst_w), likewise new_h
//     off_x = (dst_w - new_w) / 2 (integer division), likewise off_y
//     scale_x = (float)src_w / (float)new_w, likewise scale_y
// and reports per image (new_w / src_w, new_h / src_h, off_x, off_y), the map from
// source pixel coordinates to model coordinates: model = source * scale + offset.
// Inside the region, output pixel (x, y) samples source pixel (x - off_x, y - off_y) of
// the region with the convention in image_common.cuh; outside it holds
// (pad - mean[c]) * inv_std[c]. Compile with --fmad=false for bit-identical results
// with tensord.kernels.image.letterbox.
//
// Launch: block (BLOCK_X, 1, 1); grid (ceil(dst_w / BLOCK_X), dst_h, n).
#include "image_common.cuh"

template <typename Out>
__device__ void letterbox(const unsigned char* src, int src_h, int src_w, long long row,
                          long long image_stride, int dst_h, int dst_w, int new_h, int new_w,
                          int off_y, int off_x, float scale_x, float scale_y, float pad,
                          Normalise nm, Out* out, long long s_n, long long s_c, long long s_y,
                          long long s_x) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y;
    long long n = blockIdx.z;
    if (x >= dst_w || y >= dst_h) return;
    Out* o = out + n * s_n + y * s_y + x * s_x;
    int rx = x - off_x;
    int ry = y - off_y;
    if (rx < 0 || rx >= new_w || ry < 0 || ry >= new_h) {
        store_value(o, (pad - nm.mean0) * nm.inv_std0);
        store_value(o + s_c, (pad - nm.mean1) * nm.inv_std1);
        store_value(o + 2 * s_c, (pad - nm.mean2) * nm.inv_std2);
        return;
    }
    sample_store(src + n * image_stride, src_h, src_w, row, rx, ry, scale_x, scale_y, nm, o,
                 s_c);
}

extern "C" __global__ void letterbox_f32(
    const unsigned char* src, int src_h, int src_w, long long row, long long image_stride,
    int dst_h, int dst_w, int new_h, int new_w, int off_y, int off_x, float scale_x,
    float scale_y, float pad, Normalise nm, float* out, long long s_n, long long s_c,
    long long s_y, long long s_x) {
    letterbox(src, src_h, src_w, row, image_stride, dst_h, dst_w, new_h, new_w, off_y, off_x,
              scale_x, scale_y, pad, nm, out, s_n, s_c, s_y, s_x);
}

extern "C" __global__ void letterbox_f16(
    const unsigned char* src, int src_h, int src_w, long long row, long long image_stride,
    int dst_h, int dst_w, int new_h, int new_w, int off_y, int off_x, float scale_x,
    float scale_y, float pad, Normalise nm, unsigned short* out, long long s_n, long long s_c,
    long long s_y, long long s_x) {
    letterbox(src, src_h, src_w, row, image_stride, dst_h, dst_w, new_h, new_w, off_y, off_x,
              scale_x, scale_y, pad, nm, out, s_n, s_c, s_y, s_x);
}
