/* RMSNorm on the CPU (fp32), forward and backward, one pass over the rows each
   (realrl/impl/model/kernels/rms_norm.py compiles and calls it).

   y = w * x * r with r = 1 / sqrt(mean(x^2) + eps), per row of `dim` values. */
#include <math.h>
#include <stdint.h>
#include <string.h>

void rms_norm_fwd(const float *restrict x, const float *restrict w, int64_t rows, int64_t dim, float eps,
                  float *restrict y, float *restrict rstd) {
  for (int64_t i = 0; i < rows; i++) {
    const float *restrict xi = x + i * dim;
    float *restrict yi = y + i * dim;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t e = 0; e < dim; e++) ss += xi[e] * xi[e];
    const float r = 1.0f / sqrtf(ss / (float)dim + eps);
    rstd[i] = r;
#pragma omp simd
    for (int64_t e = 0; e < dim; e++) yi[e] = w[e] * (xi[e] * r);
  }
}

/* dx = r * (g - xhat * mean(g * xhat)) with g = w * dy and xhat = x * r; dw += sum over rows of
   dy * xhat (dw zeroed by the caller). */
void rms_norm_bwd(const float *restrict x, const float *restrict w, const float *restrict rstd,
                  const float *restrict dy, int64_t rows, int64_t dim, float *restrict dx, float *restrict dw) {
  for (int64_t i = 0; i < rows; i++) {
    const float *restrict xi = x + i * dim, *restrict dyi = dy + i * dim;
    float *restrict dxi = dx + i * dim;
    const float r = rstd[i];
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t e = 0; e < dim; e++) dot += w[e] * dyi[e] * xi[e];
    const float c = dot * r * r / (float)dim;
#pragma omp simd
    for (int64_t e = 0; e < dim; e++) {
      dxi[e] = r * (w[e] * dyi[e] - xi[e] * c);
      dw[e] += dyi[e] * xi[e] * r;
    }
  }
}
