/* Variable-length attention on the CPU (fp32), forward and backward, for realrl's packed batches
   (realrl/impl/model/kernels/varlen_attention.py compiles and calls it).

   Query row r attends to the keys key(start[r] + j), j < count[r], where key(i) = kidx ? kidx[i] : i;
   key row i of head g starts at k + i * k_row + g * k_head (likewise v). Consecutive queries with the
   same start form a run (one sequence): its keys are gathered once per head (transposed copies too),
   and queries are taken QT at a time, so scores and outputs are small register-tiled products. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define LANES 16 /* keys are handled in blocks of LANES; buffers are padded to a multiple */
#define QT 4     /* queries per tile */
#define MAX_HEAD_DIM 256

/* exp(x) for x <= 0 (softmax after subtracting the max): Cephes' expf polynomial, about 1 ulp,
   branch-free so that the loops calling it vectorize. */
INLINE float exp_nonpos(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
  float n = (x * 1.44269504088896341f + shifter) - shifter;
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  union { int32_t i; float f; } two_n;
  two_n.i = ((int32_t)n + 127) << 23;
  return p * two_n.f;
}

INLINE int64_t key_row(const int64_t *kidx, int64_t i) { return kidx ? kidx[i] : i; }

typedef struct {
  float *kt, *vt, *ks, *vs, *dks, *dvs, *p, *ds;
  int64_t cap;
} Buffers;

static void free_buffers(Buffers *b) {
  free(b->kt); free(b->vt); free(b->ks); free(b->vs); free(b->dks); free(b->dvs); free(b->p); free(b->ds);
}

static int alloc_buffers(Buffers *b, int64_t max_count, int64_t d) {
  int64_t cap = (max_count + LANES - 1) / LANES * LANES;
  if (cap == 0) cap = LANES;
  size_t mat = (size_t)(d * cap) * sizeof(float), tile = (size_t)(QT * cap) * sizeof(float);
  memset(b, 0, sizeof(*b));
  b->cap = cap;
  b->kt = aligned_alloc(64, mat); b->vt = aligned_alloc(64, mat);
  b->ks = aligned_alloc(64, mat); b->vs = aligned_alloc(64, mat);
  b->dks = aligned_alloc(64, mat); b->dvs = aligned_alloc(64, mat);
  b->p = aligned_alloc(64, tile); b->ds = aligned_alloc(64, tile);
  if (!b->kt || !b->vt || !b->ks || !b->vs || !b->dks || !b->dvs || !b->p || !b->ds) { free_buffers(b); return 1; }
  return 0;
}

/* Keys 0..n-1 of one head of a run, zero-padded to np: kt/vt [e][j] (transposed), ks/vs [j][e]. */
INLINE void gather_head(const float *k, int64_t k_row, const float *v, int64_t v_row, const int64_t *kidx,
                        int64_t base, int64_t n, int64_t np, const int64_t d, Buffers *b, int with_vt) {
  for (int64_t j = 0; j < np; j++) {
    if (j < n) {
      int64_t i = key_row(kidx, base + j);
      const float *kr = k + i * k_row, *vr = v + i * v_row;
      for (int64_t e = 0; e < d; e++) {
        b->ks[j * d + e] = kr[e];
        b->vs[j * d + e] = vr[e];
        b->kt[e * np + j] = kr[e];
        if (with_vt) b->vt[e * np + j] = vr[e];
      }
    } else {
      for (int64_t e = 0; e < d; e++) {
        b->ks[j * d + e] = 0.0f;
        b->vs[j * d + e] = 0.0f;
        b->kt[e * np + j] = 0.0f;
        if (with_vt) b->vt[e * np + j] = 0.0f;
      }
    }
  }
}

/* s[i][j] = scale * sum_e rows[i][e] * t[e][j], for QT rows and all np keys. */
INLINE void tile_products(float *restrict s, const float *const rows[QT], const float *restrict t, int64_t np,
                          const int64_t d, float scale) {
  for (int64_t jb = 0; jb < np; jb += LANES) {
    float acc[QT][LANES];
    for (int i = 0; i < QT; i++)
      for (int l = 0; l < LANES; l++) acc[i][l] = 0.0f;
    for (int64_t e = 0; e < d; e++) {
      const float *restrict col = t + e * np + jb;
      for (int i = 0; i < QT; i++) {
        const float x = rows[i][e];
#pragma omp simd
        for (int l = 0; l < LANES; l++) acc[i][l] += x * col[l];
      }
    }
    for (int i = 0; i < QT; i++)
      for (int l = 0; l < LANES; l++) s[i * np + jb + l] = acc[i][l] * scale;
  }
}

/* out[i][e] (+)= sum_{j < n} w[i][j] * m[j][e] for QT rows. */
INLINE void tile_weighted_sum(float *const outs[QT], const float *restrict w, const float *restrict m, int64_t np,
                              int64_t n, const int64_t d, int accumulate) {
  for (int64_t eb = 0; eb < d; eb += LANES) {
    const int64_t width = d - eb < LANES ? d - eb : LANES;
    float acc[QT][LANES];
    for (int i = 0; i < QT; i++)
      for (int l = 0; l < LANES; l++) acc[i][l] = 0.0f;
    for (int64_t j = 0; j < n; j++) {
      const float *restrict row = m + j * d + eb;
      for (int i = 0; i < QT; i++) {
        const float x = w[i * np + j];
        if (width == LANES) {
#pragma omp simd
          for (int l = 0; l < LANES; l++) acc[i][l] += x * row[l];
        } else {
          for (int l = 0; l < width; l++) acc[i][l] += x * row[l];
        }
      }
    }
    for (int i = 0; i < QT; i++)
      for (int l = 0; l < width; l++) outs[i][eb + l] = accumulate ? outs[i][eb + l] + acc[i][l] : acc[i][l];
  }
}

/* The rows of a tile: queries r0.. r0+QT-1 clipped to the run (extra slots repeat the last). */
INLINE int64_t tile_rows(int64_t r0, int64_t r1, int64_t i) { return r0 + i < r1 ? r0 + i : r1 - 1; }

typedef float vf8 __attribute__((vector_size(32)));

INLINE vf8 load8(const float *p) {
  vf8 x;
  memcpy(&x, p, sizeof(x));
  return x;
}

INLINE void store8(float *p, vf8 x) { memcpy(p, &x, sizeof(x)); }

INLINE float dot(const float *restrict a, const float *restrict b, const int64_t d) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t e = 0; e < d; e++) acc += a[e] * b[e];
  return acc;
}

/* A run of one query (a decoding step, a reward model's last token): no gather, no tile; the
   keys are read in place. */
INLINE void fwd_single(const float *qr, const float *k, int64_t k_row, const float *v, int64_t v_row,
                       const int64_t *kidx, int64_t base, int64_t n, const int64_t d, float scale,
                       float *restrict o, float *lse, float *restrict s) {
  if (n <= 0) {
    for (int64_t e = 0; e < d; e++) o[e] = 0.0f;
    *lse = -INFINITY;
    return;
  }
  float m = -INFINITY;
  for (int64_t j = 0; j < n; j++) {
    s[j] = dot(qr, k + key_row(kidx, base + j) * k_row, d) * scale;
    m = s[j] > m ? s[j] : m;
  }
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; j++) {
    s[j] = exp_nonpos(s[j] - m);
    sum += s[j];
  }
  const float inv = 1.0f / sum;
  /* 8 output columns at a time in vector registers (GCC/Clang vector types: left to itself the
     compiler interchanged the loops here and read v with a stride of v_row) */
  int64_t eb = 0;
  for (; eb + 8 <= d; eb += 8) {
    vf8 acc = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t j = 0; j < n; j++) acc += s[j] * load8(v + key_row(kidx, base + j) * v_row + eb);
    store8(o + eb, acc * inv);
  }
  for (; eb < d; eb++) {
    float acc = 0.0f;
    for (int64_t j = 0; j < n; j++) acc += s[j] * v[key_row(kidx, base + j) * v_row + eb];
    o[eb] = acc * inv;
  }
  *lse = m + logf(sum);
}

/* dk/dv rows are [rows, hkv, d]: ``dk_head`` is this head's offset, ``dk_row`` = hkv * d. */
INLINE void bwd_single(const float *restrict qr, const float *k, int64_t k_row, const float *v, int64_t v_row,
                       const int64_t *kidx, int64_t base, int64_t n, const int64_t d, float scale,
                       const float *restrict orow, float l, const float *restrict dor, float *restrict dqr,
                       float *dk, float *dv, int64_t dk_row, float *restrict s) {
  if (n <= 0) return;
  const float delta = dot(dor, orow, d);
  for (int64_t j = 0; j < n; j++) s[j] = dot(qr, k + key_row(kidx, base + j) * k_row, d) * scale - l;
#pragma omp simd
  for (int64_t j = 0; j < n; j++) s[j] = exp_nonpos(s[j]);
  for (int64_t j = 0; j < n; j++) {
    const int64_t i = key_row(kidx, base + j);
    const float *restrict kr = k + i * k_row, *restrict vr = v + i * v_row;
    float *restrict dkr = dk + i * dk_row, *restrict dvr = dv + i * dk_row;
    const float p = s[j], ds = p * (dot(dor, vr, d) - delta) * scale;
#pragma omp simd
    for (int64_t e = 0; e < d; e++) {
      dvr[e] += p * dor[e];
      dqr[e] += ds * kr[e];
      dkr[e] += ds * qr[e];
    }
  }
}

INLINE void fwd_impl(const float *q, int64_t q_row, int64_t n_q, const float *k, int64_t k_row, int64_t k_head,
                     const float *v, int64_t v_row, int64_t v_head, const int64_t *kidx, const int64_t *start,
                     const int64_t *count, int64_t hq, int64_t hkv, const int64_t d, float scale, float *out,
                     float *lse, Buffers *b) {
  const int64_t group = hq / hkv;
  float tmp[QT][MAX_HEAD_DIM];
  for (int64_t r0 = 0, r1; r0 < n_q; r0 = r1) {
    int64_t base = start[r0], n_run = 0;
    for (r1 = r0; r1 < n_q && start[r1] == base; r1++) n_run = count[r1] > n_run ? count[r1] : n_run;
    if (r1 - r0 == 1) {
      for (int64_t h = 0; h < hq; h++) {
        const int64_t g = h / group;
        fwd_single(q + r0 * q_row + h * d, k + g * k_head, k_row, v + g * v_head, v_row, kidx, base, n_run, d,
                   scale, out + (r0 * hq + h) * d, lse + r0 * hq + h, b->p);
      }
      continue;
    }
    const int64_t np = (n_run + LANES - 1) / LANES * LANES;
    for (int64_t g = 0; g < hkv; g++) {
      gather_head(k + g * k_head, k_row, v + g * v_head, v_row, kidx, base, n_run, np, d, b, 0);
      for (int64_t h = g * group; h < (g + 1) * group; h++) {
        for (int64_t t0 = r0; t0 < r1; t0 += QT) {
          const float *rows[QT];
          int64_t n_tile = 0;
          for (int i = 0; i < QT; i++) {
            int64_t r = tile_rows(t0, r1, i);
            rows[i] = q + r * q_row + h * d;
            n_tile = count[r] > n_tile ? count[r] : n_tile;
          }
          tile_products(b->p, rows, b->kt, np, d, scale);
          float sums[QT];
          for (int i = 0; i < QT; i++) {
            int64_t r = tile_rows(t0, r1, i), n = count[r];
            float *restrict s = b->p + i * np;
            float m = -INFINITY;
#pragma omp simd reduction(max : m)
            for (int64_t j = 0; j < n; j++) m = s[j] > m ? s[j] : m;
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j < n; j++) {
              float p = exp_nonpos(s[j] - m);
              s[j] = p;
              sum += p;
            }
            for (int64_t j = n > 0 ? n : 0; j < np; j++) s[j] = 0.0f;
            sums[i] = sum;
            if (t0 + i < r1) lse[r * hq + h] = n > 0 ? m + logf(sum) : -INFINITY;
          }
          float *outs[QT];
          for (int i = 0; i < QT; i++) outs[i] = tmp[i];
          tile_weighted_sum(outs, b->p, b->vs, np, n_tile, d, 0);
          for (int i = 0; i < QT && t0 + i < r1; i++) {
            int64_t r = t0 + i;
            float *o = out + (r * hq + h) * d;
            const float inv = count[r] > 0 ? 1.0f / sums[i] : 0.0f;
            for (int64_t e = 0; e < d; e++) o[e] = tmp[i][e] * inv;
          }
        }
      }
    }
  }
}

INLINE void bwd_impl(const float *q, int64_t q_row, int64_t n_q, const float *k, int64_t k_row, int64_t k_head,
                     const float *v, int64_t v_row, int64_t v_head, const int64_t *kidx, const int64_t *start,
                     const int64_t *count, int64_t hq, int64_t hkv, const int64_t d, float scale, const float *out,
                     const float *lse, const float *dout, float *dq, float *dk, float *dv, Buffers *b) {
  const int64_t group = hq / hkv;
  float dummy[MAX_HEAD_DIM];
  for (int64_t r0 = 0, r1; r0 < n_q; r0 = r1) {
    int64_t base = start[r0], n_run = 0;
    for (r1 = r0; r1 < n_q && start[r1] == base; r1++) n_run = count[r1] > n_run ? count[r1] : n_run;
    if (r1 - r0 == 1) {
      for (int64_t h = 0; h < hq; h++) {
        const int64_t g = h / group, at = (r0 * hq + h) * d;
        bwd_single(q + r0 * q_row + h * d, k + g * k_head, k_row, v + g * v_head, v_row, kidx, base, n_run, d,
                   scale, out + at, lse[r0 * hq + h], dout + at, dq + at, dk + g * d, dv + g * d, hkv * d, b->p);
      }
      continue;
    }
    const int64_t np = (n_run + LANES - 1) / LANES * LANES;
    for (int64_t g = 0; g < hkv; g++) {
      gather_head(k + g * k_head, k_row, v + g * v_head, v_row, kidx, base, n_run, np, d, b, 1);
      memset(b->dks, 0, sizeof(float) * np * d);
      memset(b->dvs, 0, sizeof(float) * np * d);
      for (int64_t h = g * group; h < (g + 1) * group; h++) {
        for (int64_t t0 = r0; t0 < r1; t0 += QT) {
          const float *qrows[QT], *drows[QT];
          float *dqrows[QT];
          int64_t n_tile = 0;
          for (int i = 0; i < QT; i++) {
            int64_t r = tile_rows(t0, r1, i);
            qrows[i] = q + r * q_row + h * d;
            drows[i] = dout + (r * hq + h) * d;
            dqrows[i] = t0 + i < r1 ? dq + (r * hq + h) * d : dummy;
            n_tile = count[r] > n_tile ? count[r] : n_tile;
          }
          tile_products(b->p, qrows, b->kt, np, d, scale);
          tile_products(b->ds, drows, b->vt, np, d, 1.0f);
          for (int i = 0; i < QT; i++) {
            int64_t r = tile_rows(t0, r1, i);
            /* a repeated slot (past the run's end) and empty rows add nothing */
            int64_t n = (t0 + i < r1) ? count[r] : 0;
            const float l = lse[r * hq + h];
            const float *orow = out + (r * hq + h) * d;
            float delta = 0.0f;
            for (int64_t e = 0; e < d; e++) delta += drows[i][e] * orow[e];
            float *restrict p = b->p + i * np, *restrict ds = b->ds + i * np;
#pragma omp simd
            for (int64_t j = 0; j < n; j++) {
              float pj = exp_nonpos(p[j] - l);
              p[j] = pj;
              ds[j] = pj * (ds[j] - delta) * scale;
            }
            for (int64_t j = n > 0 ? n : 0; j < np; j++) p[j] = ds[j] = 0.0f;
          }
          tile_weighted_sum(dqrows, b->ds, b->ks, np, n_tile, d, 1);
          /* dK[j] += sum_i ds[i][j] q_i;  dV[j] += sum_i p[i][j] dout_i */
          for (int64_t j = 0; j < n_tile; j++) {
            float *restrict dkr = b->dks + j * d, *restrict dvr = b->dvs + j * d;
            for (int i = 0; i < QT; i++) {
              const float a = b->ds[i * np + j], c = b->p[i * np + j];
              const float *restrict qi = qrows[i], *restrict di = drows[i];
#pragma omp simd
              for (int64_t e = 0; e < d; e++) {
                dkr[e] += a * qi[e];
                dvr[e] += c * di[e];
              }
            }
          }
        }
      }
      for (int64_t j = 0; j < n_run; j++) {
        int64_t i = key_row(kidx, base + j);
        float *restrict dkr = dk + (i * hkv + g) * d, *restrict dvr = dv + (i * hkv + g) * d;
        const float *restrict a = b->dks + j * d, *restrict c = b->dvs + j * d;
#pragma omp simd
        for (int64_t e = 0; e < d; e++) {
          dkr[e] += a[e];
          dvr[e] += c[e];
        }
      }
    }
  }
}

#define ARGS q, q_row, n_q, k, k_row, k_head, v, v_row, v_head, kidx, start, count, hq, hkv
#define FWD_CASE(D) case D: fwd_impl(ARGS, D, scale, out, lse, &b); break;
#define BWD_CASE(D) case D: bwd_impl(ARGS, D, scale, out, lse, dout, dq, dk, dv, &b); break;

/* Return codes: 0 done; 1 out of memory; 2 head dimension outside 1..MAX_HEAD_DIM. */
int varlen_attn_fwd(const float *q, int64_t q_row, int64_t n_q, const float *k, int64_t k_row, int64_t k_head,
                    const float *v, int64_t v_row, int64_t v_head, const int64_t *kidx, const int64_t *start,
                    const int64_t *count, int64_t hq, int64_t hkv, int64_t d, float scale, float *out,
                    float *lse, int64_t max_count) {
  if (d > MAX_HEAD_DIM || d < 1) return 2;
  Buffers b;
  if (alloc_buffers(&b, max_count, d)) return 1;
  switch (d) {
    FWD_CASE(16) FWD_CASE(32) FWD_CASE(64) FWD_CASE(128)
    default: fwd_impl(ARGS, d, scale, out, lse, &b);
  }
  free_buffers(&b);
  return 0;
}

int varlen_attn_bwd(const float *q, int64_t q_row, int64_t n_q, const float *k, int64_t k_row, int64_t k_head,
                    const float *v, int64_t v_row, int64_t v_head, const int64_t *kidx, const int64_t *start,
                    const int64_t *count, int64_t hq, int64_t hkv, int64_t d, float scale, const float *out,
                    const float *lse, const float *dout, float *dq, float *dk, float *dv, int64_t max_count) {
  if (d > MAX_HEAD_DIM || d < 1) return 2;
  Buffers b;
  if (alloc_buffers(&b, max_count, d)) return 1;
  switch (d) {
    BWD_CASE(16) BWD_CASE(32) BWD_CASE(64) BWD_CASE(128)
    default: bwd_impl(ARGS, d, scale, out, lse, dout, dq, dk, dv, &b);
  }
  free_buffers(&b);
  return 0;
}
