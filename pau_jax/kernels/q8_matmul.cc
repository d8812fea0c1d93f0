// Q8_0 matrix product on the CPU: float32 rows times block-quantised int8 weights, as an
// XLA FFI handler.
//
// Arithmetic (the same as pau_jax/kernels/q8.py): activations x [M, K] are quantised per
// block of 32 along K (d = max|x| / 127, q = round-to-nearest-even(x / d), q = 0 where
// d = 0; K is zero-padded to Kp = the weights' padded length); weights arrive quantised
// the same way as qs [N, Kp] int8 and scales [N, Kp / 32] float32. Then
//   out[m, n] = sum_b dx[m, b] * dw[n, b] * sum_i qx[m, b, i] * qw[n, b, i],
// with int32 sums inside a block and float sums over blocks.
//
// Two instruction paths give the same integer block sums: AVX2 (sign, maddubs, madd) on
// every CPU the kernel runs on, and AVX-512 VNNI where the CPU has it (checked once at run
// time; the functions carry their own target attribute, so the library still builds with
// -mavx2). VNNI's dpbusd multiplies unsigned by signed bytes, so activations enter it as
// qx + 128 and each weight block's 128 * sum(qw) is taken off again: exact in int32. Only
// the order of the float sums over blocks differs between the paths.
//
// Work is split over N into chunks taken from a shared counter by the calling thread and by
// closures scheduled on XLA's intra-op thread pool (ffi::ThreadPool): a closure that has
// not started when the chunks run out takes none, so the call never waits on a pool thread
// that is busy elsewhere; it waits only for chunks already being computed.

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using F32Matrix = ffi::Buffer<ffi::F32, 2>;
using S8Matrix = ffi::Buffer<ffi::S8, 2>;

constexpr int64_t kBlock = 32;
// Activation rows and weight rows of one register tile (measured on Zen 4 for 1, 8 and 16
// rows against 3x3, 4x4, 8x1 and 1x4: best or tied at every size).
constexpr int kRowTile = 4;
constexpr int kColTile = 2;
// Activation rows per outer block (keeps their int8 copy in the L2 cache for large M).
constexpr int64_t kRowBlock = 64;
// Below this many multiply-adds (M * N * Kp) the call runs on the calling thread alone.
constexpr int64_t kMinParallelWork = 1 << 18;

// Quantises one row x [k] into q [kp] int8 and d [kp / 32] float32; with `offset` each q is
// stored as the unsigned byte q + 128 (the VNNI path's form).
void QuantizeRow(const float* x, int64_t k, int64_t kp, int8_t* q, float* d, bool offset) {
  const __m256i flip = _mm256_set1_epi8(offset ? static_cast<char>(0x80) : 0);
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  const __m256 lo = _mm256_set1_ps(-127.0f);
  const __m256 hi = _mm256_set1_ps(127.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < kp / kBlock; ++b) {
    alignas(32) float buf[kBlock] = {0};
    const int64_t start = b * kBlock;
    const int64_t count = std::max<int64_t>(0, std::min(kBlock, k - start));
    if (count > 0) std::memcpy(buf, x + start, count * sizeof(float));
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_load_ps(buf + 8 * j);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_bit, v[j]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float scale = _mm_cvtss_f32(m4) / 127.0f;
    d[b] = scale;
    int8_t* out = q + start;
    if (scale == 0.0f) {
      std::memset(out, offset ? 0x80 : 0, kBlock);
      continue;
    }
    const __m256 div = _mm256_set1_ps(scale);
    __m256i i32[4];
    for (int j = 0; j < 4; ++j) {
      __m256 r = _mm256_round_ps(_mm256_div_ps(v[j], div),
                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      i32[j] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
    }
    // packs works within 128-bit lanes; the permute puts the 32 values back in order.
    const __m256i i16a = _mm256_packs_epi32(i32[0], i32[1]);
    const __m256i i16b = _mm256_packs_epi32(i32[2], i32[3]);
    const __m256i i8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(i16a, i16b), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_xor_si256(i8, flip));
  }
}

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The int32 dot products of one block of 32 int8 pairs, as 8 partial sums: |w| times x with
// w's sign (maddubs takes an unsigned and a signed operand), pairs to int16, then to int32.
inline __m256i BlockDot(__m256i w_abs, __m256i w, __m256i x, __m256i ones) {
  const __m256i pairs = _mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(x, w));
  return _mm256_madd_epi16(pairs, ones);
}

// out[r, c] for MR activation rows and NR weight rows, all blocks.
template <int MR, int NR>
void Tile(const int8_t* qx, const float* dx, const int8_t* qw, const float* dw, int64_t kp,
          float* out, int64_t ldo) {
  const int64_t nb = kp / kBlock;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    // The hardware prefetcher alone leaves a single thread at a third of the DRAM
    // bandwidth here: fetch the next tile's rows (they follow this tile's) at the same pace.
    for (int p = 0; p < NR * kBlock; p += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(qw + NR * kp + b * NR * kBlock + p),
                   _MM_HINT_T0);
    }
    __m256i w[NR], w_abs[NR];
    for (int c = 0; c < NR; ++c) {
      w[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qw + c * kp + b * kBlock));
      w_abs[c] = _mm256_sign_epi8(w[c], w[c]);
    }
    for (int r = 0; r < MR; ++r) {
      const __m256i x =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + r * kp + b * kBlock));
      const float dxr = dx[r * nb + b];
      for (int c = 0; c < NR; ++c) {
        const __m256 sums = _mm256_cvtepi32_ps(BlockDot(w_abs[c], w[c], x, ones));
        acc[r][c] = _mm256_fmadd_ps(sums, _mm256_set1_ps(dxr * dw[c * nb + b]), acc[r][c]);
      }
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) out[r * ldo + c] = HorizontalSum(acc[r][c]);
}

static_assert(kRowTile == 4, "RowTail dispatches 1 to 4 rows");

template <int NR>
void RowTail(int rows, const int8_t* qx, const float* dx, const int8_t* qw, const float* dw,
             int64_t kp, float* out, int64_t ldo) {
  switch (rows) {
    case 1: Tile<1, NR>(qx, dx, qw, dw, kp, out, ldo); break;
    case 2: Tile<2, NR>(qx, dx, qw, dw, kp, out, ldo); break;
    case 3: Tile<3, NR>(qx, dx, qw, dw, kp, out, ldo); break;
    default: Tile<kRowTile, NR>(qx, dx, qw, dw, kp, out, ldo); break;
  }
}

#define PAU_VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))

bool CpuHasAvx512Vnni() {
  static const bool has = __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512vnni");
  return has;
}

// 16 lanes: a in the low 8, b in the high 8 (the scales of two consecutive blocks).
PAU_VNNI inline __m512 ScalePair(float a, float b) {
  return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1);
}

// Tile with AVX-512 VNNI, two blocks (64 bytes) per instruction; xu holds qx + 128.
template <int MR, int NR>
PAU_VNNI void TileVnni(const uint8_t* xu, const float* dx, const int8_t* qw, const float* dw,
                       int64_t kp, float* out, int64_t ldo) {
  const int64_t nb = kp / kBlock;
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i zero = _mm512_setzero_si512();
  __m512 acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b += 2) {
    const bool pair = b + 1 < nb;
    // A lone last block is loaded as 32 bytes and 32 zeros, which add nothing.
    const __mmask64 bytes = pair ? ~__mmask64{0} : __mmask64{0xFFFFFFFFu};
    for (int p = 0; p < NR * 2 * kBlock; p += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(qw + NR * kp + b * NR * kBlock + p),
                   _MM_HINT_T0);
    }
    __m512i w[NR], minus_offset[NR];
    __m512 sw[NR];
    for (int c = 0; c < NR; ++c) {
      w[c] = _mm512_maskz_loadu_epi8(bytes, qw + c * kp + b * kBlock);
      // -(128 * sum of the block's weights), four per lane, as dpbusd groups them.
      minus_offset[c] = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, offset, w[c]));
      sw[c] = ScalePair(dw[c * nb + b], pair ? dw[c * nb + b + 1] : 0.0f);
    }
    for (int r = 0; r < MR; ++r) {
      const __m512i x = _mm512_maskz_loadu_epi8(bytes, xu + r * kp + b * kBlock);
      const __m512 sx = ScalePair(dx[r * nb + b], pair ? dx[r * nb + b + 1] : 0.0f);
      for (int c = 0; c < NR; ++c) {
        const __m512 sums = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(minus_offset[c], x, w[c]));
        acc[r][c] = _mm512_fmadd_ps(sums, _mm512_mul_ps(sx, sw[c]), acc[r][c]);
      }
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) out[r * ldo + c] = _mm512_reduce_add_ps(acc[r][c]);
}

template <int NR>
PAU_VNNI void RowTailVnni(int rows, const uint8_t* xu, const float* dx, const int8_t* qw,
                          const float* dw, int64_t kp, float* out, int64_t ldo) {
  switch (rows) {
    case 1: TileVnni<1, NR>(xu, dx, qw, dw, kp, out, ldo); break;
    case 2: TileVnni<2, NR>(xu, dx, qw, dw, kp, out, ldo); break;
    case 3: TileVnni<3, NR>(xu, dx, qw, dw, kp, out, ldo); break;
    default: TileVnni<kRowTile, NR>(xu, dx, qw, dw, kp, out, ldo); break;
  }
}

struct Job {
  int64_t m, n, kp;
  bool vnni;               // qx holds qx + 128 (as unsigned bytes) for the VNNI path
  std::vector<int8_t> qx;  // [m, kp]
  std::vector<float> dx;   // [m, kp / 32]
  const int8_t* qw;        // [n, kp]
  const float* dw;         // [n, kp / 32]
  float* out;              // [m, n]
  int64_t chunk_cols, num_chunks;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

// Output columns [n0, n1) for every row.
void RunColumns(const Job& job, int64_t n0, int64_t n1) {
  const int64_t nb = job.kp / kBlock;
  for (int64_t m0 = 0; m0 < job.m; m0 += kRowBlock) {
    const int64_t m1 = std::min(job.m, m0 + kRowBlock);
    for (int64_t c = n0; c < n1; c += kColTile) {
      const int8_t* qw = job.qw + c * job.kp;
      const float* dw = job.dw + c * nb;
      for (int64_t r = m0; r < m1; r += kRowTile) {
        const int rows = static_cast<int>(std::min<int64_t>(kRowTile, m1 - r));
        const int8_t* qx = job.qx.data() + r * job.kp;
        const float* dx = job.dx.data() + r * nb;
        float* out = job.out + r * job.n + c;
        const bool pair = c + kColTile <= n1;
        if (job.vnni) {
          const uint8_t* xu = reinterpret_cast<const uint8_t*>(qx);
          if (pair) {
            RowTailVnni<kColTile>(rows, xu, dx, qw, dw, job.kp, out, job.n);
          } else {
            RowTailVnni<1>(rows, xu, dx, qw, dw, job.kp, out, job.n);
          }
        } else if (pair) {
          RowTail<kColTile>(rows, qx, dx, qw, dw, job.kp, out, job.n);
        } else {
          RowTail<1>(rows, qx, dx, qw, dw, job.kp, out, job.n);
        }
      }
    }
  }
}

void TakeChunks(Job& job) {
  int64_t finished = 0;
  for (int64_t i = job.next.fetch_add(1); i < job.num_chunks; i = job.next.fetch_add(1)) {
    const int64_t n0 = i * job.chunk_cols;
    RunColumns(job, n0, std::min(job.n, n0 + job.chunk_cols));
    ++finished;
  }
  if (finished > 0) job.done.fetch_add(finished, std::memory_order_acq_rel);
}

ffi::Error Q8MatmulImpl(ffi::ThreadPool pool, F32Matrix x, S8Matrix qs, F32Matrix scales,
                        ffi::Result<F32Matrix> out, int64_t max_threads, int64_t avx512) {
  const int64_t m = x.dimensions()[0], k = x.dimensions()[1];
  const int64_t n = qs.dimensions()[0], kp = qs.dimensions()[1];
  if (kp % kBlock != 0 || kp < k || scales.dimensions()[0] != n ||
      scales.dimensions()[1] != kp / kBlock || out->dimensions()[0] != m ||
      out->dimensions()[1] != n) {
    return ffi::Error::InvalidArgument("q8_matmul: inconsistent shapes of x, qs, scales, out");
  }
  if (m == 0 || n == 0) return ffi::Error::Success();
  auto job = std::make_shared<Job>();
  job->m = m;
  job->n = n;
  job->kp = kp;
  job->vnni = avx512 != 0 && CpuHasAvx512Vnni();
  job->qx.resize(m * kp);
  job->dx.resize(m * (kp / kBlock));
  for (int64_t r = 0; r < m; ++r) {
    QuantizeRow(x.typed_data() + r * k, k, kp, job->qx.data() + r * kp,
                job->dx.data() + r * (kp / kBlock), job->vnni);
  }
  job->qw = qs.typed_data();
  job->dw = scales.typed_data();
  job->out = out->typed_data();

  int64_t threads = std::max<int64_t>(1, pool.num_threads());
  if (max_threads > 0) threads = std::min(threads, max_threads);
  if (m * n * kp < kMinParallelWork) threads = 1;
  // About two chunks per thread, each a whole number of column tiles: a pool thread that
  // starts late leaves at most half a share to wait for, and fewer hand-offs measured
  // faster than four chunks per thread (SmolLM2's decode products: 0.92x the time at one
  // row, 0.98x at eight; docs/benchmarks.md, "Fewer kernel calls").
  const int64_t per_chunk = (n + 2 * threads - 1) / (2 * threads);
  job->chunk_cols = std::max<int64_t>(kColTile, (per_chunk + kColTile - 1) / kColTile * kColTile);
  job->num_chunks = (n + job->chunk_cols - 1) / job->chunk_cols;
  threads = std::min(threads, job->num_chunks);
  for (int64_t t = 1; t < threads; ++t) {
    pool.Schedule([job] { TakeChunks(*job); });
  }
  TakeChunks(*job);
  // Chunks still being computed on pool threads: at most one each, so spin, then yield.
  for (int spins = 0; job->done.load(std::memory_order_acquire) < job->num_chunks; ++spins) {
    if (spins < 4096) {
      _mm_pause();
    } else {
      std::this_thread::yield();
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PauQ8Matmul, Q8MatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<F32Matrix>()
                                  .Arg<S8Matrix>()
                                  .Arg<F32Matrix>()
                                  .Ret<F32Matrix>()
                                  .Attr<int64_t>("max_threads")
                                  .Attr<int64_t>("avx512"));

// 1 where the CPU has AVX-512 VNNI (the kernel then uses it unless told not to), else 0.
extern "C" int PauQ8HasAvx512Vnni() { return CpuHasAvx512Vnni() ? 1 : 0; }
