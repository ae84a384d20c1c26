// Shared by preprocess.cu and letterbox.cu: bilinear sampling of uint8 HWC images and
// float32/float16 stores. No #include: NVRTC compiles these without the CUDA toolkit's
// headers, so the float16 conversion is one PTX instruction.
//
// Resize convention (OpenCV INTER_LINEAR, half-pixel centres), per axis, for output
// coordinate d of an output of size `out` from an input of size `in`:
//     scale = (float)in / (float)out                         (computed on the host)
//     f     = ((float)d + 0.5f) * scale - 0.5f
//     i     = floor(f);  a = f - i
//     i < 0       -> i = 0,      a = 0
//     i >= in - 1 -> i = in - 1, a = 0
//     i1    = min(i + 1, in - 1)
// then, with p00..p11 the four neighbours as float and wx0 = 1 - ax, wy0 = 1 - ay:
//     top = p00 * wx0 + p01 * ax;  bottom = p10 * wx0 + p11 * ax
//     v   = top * wy0 + bottom * ay
//     out = (v - mean[c]) * inv_std[c]
// Every step is one IEEE float32 operation. Compiled with --fmad=false (no fused
// multiply-adds) the results are bit for bit those of the NumPy twin
// (tensord.kernels.image), which performs the same operations in the same order.
#pragma once

__device__ __forceinline__ unsigned short f32_to_f16_bits(float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));  // round to nearest even
    return h;
}

__device__ __forceinline__ void store_value(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_value(unsigned short* p, float v) { *p = f32_to_f16_bits(v); }

// One axis of the convention above.
__device__ __forceinline__ void bilinear_axis(int d, float scale, int in, int* i0, int* i1,
                                              float* a) {
    float f = ((float)d + 0.5f) * scale - 0.5f;
    float fl = floorf(f);
    int i = (int)fl;
    float frac = f - fl;
    if (i < 0) {
        i = 0;
        frac = 0.0f;
    }
    if (i >= in - 1) {
        i = in - 1;
        frac = 0.0f;
    }
    *i0 = i;
    *i1 = min(i + 1, in - 1);
    *a = frac;
}

// Normalisation constants per output channel, and which input channel feeds it
// (RGB <-> BGR swaps).
struct Normalise {
    float mean0, mean1, mean2;
    float inv_std0, inv_std1, inv_std2;
    int src0, src1, src2;
};

// Resample output pixel (x, y) of a region (`scale_x`, `scale_y` = input / region size)
// from image `img` (src_h x src_w x 3 bytes, rows `row` bytes apart) and store its three
// normalised channels at out[c * s_c] for c = 0, 1, 2.
template <typename Out>
__device__ __forceinline__ void sample_store(const unsigned char* img, int src_h, int src_w,
                                             long long row, int x, int y, float scale_x,
                                             float scale_y, const Normalise& nm, Out* out,
                                             long long s_c) {
    int x0, x1, y0, y1;
    float ax, ay;
    bilinear_axis(x, scale_x, src_w, &x0, &x1, &ax);
    bilinear_axis(y, scale_y, src_h, &y0, &y1, &ay);
    const unsigned char* r0 = img + (long long)y0 * row;
    const unsigned char* r1 = img + (long long)y1 * row;
    float wx0 = 1.0f - ax;
    float wy0 = 1.0f - ay;
    int src[3] = {nm.src0, nm.src1, nm.src2};
    float mean[3] = {nm.mean0, nm.mean1, nm.mean2};
    float inv_std[3] = {nm.inv_std0, nm.inv_std1, nm.inv_std2};
#pragma unroll
    for (int c = 0; c < 3; ++c) {
        int s = src[c];
        float p00 = (float)r0[x0 * 3 + s];
        float p01 = (float)r0[x1 * 3 + s];
        float p10 = (float)r1[x0 * 3 + s];
        float p11 = (float)r1[x1 * 3 + s];
        float top = p00 * wx0 + p01 * ax;
        float bottom = p10 * wx0 + p11 * ax;
        float v = top * wy0 + bottom * ay;
        store_value(out + c * s_c, (v - mean[c]) * inv_std[c]);
    }
}
