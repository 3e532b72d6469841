// The kit's int4 product on CPUs with avx512_bf16 (ssd.models.int4_kernel builds it; docs/precision.md, int4):
// y = x W^T with x bfloat16 [M, K] and W int4 [N, K] in groups of 32 along K, w = (q - 8) s + z per group (torch's
// convention, so the same levels, scales and zeros serve both kernels), y bfloat16 [M, N].
//
// Why its own: torch's int4 kernel unpacks a group's levels for every row of a call, so a 4-row verify pass costs
// 1.7 one-row steps and a step reads about 18 GB/s. Here a group is unpacked once for all rows and multiplied with
// vdpbf16ps (bfloat16 pairs summed into float32), 16 columns a 512-bit register:
//   sum_k x_k ((q_k - 8) s + z) = s * sum_k x_k (128 + q_k) + (z - 136 s) * sum_k x_k
// and a nibble OR 0x4300 is the bfloat16 number 128 + q, exactly: unpacking is a shift and one ternary logic op.
// A row's sums run in the same order whatever the call's rows, so a row of a 5-row call equals its 1-row call bit
// for bit (tests/test_int4_kernel.py): a verify pass computes what the steps would.
//
// Layout (pack): N % 16 == 0, K % 32 == 0, G = K / 32; a 320-byte block per 16 columns x 32 inputs, the blocks of one
// 16-column tile contiguous along K. In a block, bytes 0..255 are 4 chunks c of 32 16-bit words; word i of chunk c
// holds in bits 4j..4j+3 (j = 0..3) q[n, k] with n = 16t + i / 2 and k = 32g + 2 (4c + j) + (i & 1), so each 32-bit
// lane is one column's pair of inputs, as vdpbf16ps takes them; bytes 256..319 are the 16 columns' (scale, zero)
// bfloat16 pairs.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t BLOCK = 320;   // bytes of one block: 16 columns x 32 inputs
constexpr int64_t CHUNK = 5;     // rows a pass over the weights takes at most

inline const uint8_t* tile_at(const uint8_t* w, int64_t groups, int64_t tile) { return w + tile * groups * BLOCK; }

// Streams: each thread reads T tiles far apart at once (one stream read 10 GB/s here, four 15-22); from 3 rows the
// dot products, not the memory, set the pace, so 2 streams and a prefetch 4 groups ahead.
constexpr int streams(int rows) { return rows <= 2 ? 4 : 2; }
constexpr int64_t prefetch_groups(int rows) { return rows <= 2 ? 0 : 4; }

// T tiles (t0, t0 + step, ...) of M rows: xp holds x's bfloat16 pairs as [group][pair 0..15][row], sums the rows'
// sums of x a group as [group][row].
template <int M, int T>
void run_tiles(const uint8_t* __restrict w, int64_t groups, int64_t t0, int64_t step, const uint32_t* __restrict xp,
               const float* __restrict sums, uint16_t* __restrict out, int64_t ldo) {
  const __m512i low4 = _mm512_set1_epi16(0x000F);
  const __m512i exponent = _mm512_set1_epi16(0x4300);
  const __m512i high16 = _mm512_set1_epi32((int)0xFFFF0000u);
  const __m512 c136 = _mm512_set1_ps(136.0f);
  __m512 o[M][T];
  for (int m = 0; m < M; ++m)
    for (int tt = 0; tt < T; ++tt) o[m][tt] = _mm512_setzero_ps();
  const uint8_t* base[T];
  for (int tt = 0; tt < T; ++tt) base[tt] = tile_at(w, groups, t0 + tt * step);
  constexpr int64_t pf = prefetch_groups(M);
  for (int64_t g = 0; g < groups; ++g) {
    if (pf > 0 && g + pf < groups)
      for (int tt = 0; tt < T; ++tt)
        for (int line = 0; line < 5; ++line)
          _mm_prefetch((const char*)(base[tt] + (g + pf) * BLOCK + 64 * line), _MM_HINT_T0);
    __m512 acc[M][T];
    const uint32_t* xg = xp + g * 16 * M;
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      __m512i words[T];
      for (int tt = 0; tt < T; ++tt) words[tt] = _mm512_loadu_si512((const void*)(base[tt] + g * BLOCK + c * 64));
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        __m512i levels[T];
        for (int tt = 0; tt < T; ++tt) {
          const __m512i shifted = j == 0 ? words[tt] : _mm512_srli_epi16(words[tt], 4 * j);
          levels[tt] = _mm512_ternarylogic_epi32(shifted, low4, exponent, 0xEA);  // (a & b) | c: 128 + q, bfloat16
        }
        const int pair = 4 * c + j;
        for (int m = 0; m < M; ++m) {
          const __m512bh xb = (__m512bh)_mm512_set1_epi32((int)xg[pair * M + m]);
          for (int tt = 0; tt < T; ++tt)
            acc[m][tt] = _mm512_dpbf16_ps(pair == 0 ? _mm512_setzero_ps() : acc[m][tt], (__m512bh)levels[tt], xb);
        }
      }
    }
    for (int tt = 0; tt < T; ++tt) {
      const __m512i sz = _mm512_loadu_si512((const void*)(base[tt] + g * BLOCK + 256));
      const __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(sz, 16));
      const __m512 shift = _mm512_fnmadd_ps(c136, s, _mm512_castsi512_ps(_mm512_and_si512(sz, high16)));  // z - 136s
      for (int m = 0; m < M; ++m) {
        o[m][tt] = _mm512_fmadd_ps(acc[m][tt], s, o[m][tt]);
        o[m][tt] = _mm512_fmadd_ps(shift, _mm512_set1_ps(sums[g * M + m]), o[m][tt]);
      }
    }
  }
  for (int m = 0; m < M; ++m)
    for (int tt = 0; tt < T; ++tt)
      _mm256_storeu_si256((__m256i*)(out + m * ldo + (t0 + tt * step) * 16), (__m256i)_mm512_cvtneps_pbh(o[m][tt]));
}

// Tiles [begin, end) of one thread: cut into T parts read side by side, the remainder one tile at a time.
template <int M>
void run_range(const uint8_t* w, int64_t groups, int64_t begin, int64_t end, const uint32_t* xp, const float* sums,
               uint16_t* out, int64_t ldo) {
  constexpr int T = streams(M);
  const int64_t part = (end - begin) / T;
  for (int64_t i = 0; i < part; ++i) run_tiles<M, T>(w, groups, begin + i, part, xp, sums, out, ldo);
  for (int64_t t = begin + part * T; t < end; ++t) run_tiles<M, 1>(w, groups, t, 1, xp, sums, out, ldo);
}

void run_rows(int rows, const uint8_t* w, int64_t groups, int64_t begin, int64_t end, const uint32_t* xp,
              const float* sums, uint16_t* out, int64_t ldo) {
  switch (rows) {
    case 1: return run_range<1>(w, groups, begin, end, xp, sums, out, ldo);
    case 2: return run_range<2>(w, groups, begin, end, xp, sums, out, ldo);
    case 3: return run_range<3>(w, groups, begin, end, xp, sums, out, ldo);
    case 4: return run_range<4>(w, groups, begin, end, xp, sums, out, ldo);
    default: return run_range<5>(w, groups, begin, end, xp, sums, out, ldo);
  }
}

// q [N, K] levels 0..15 (any integer dtype), scales_and_zeros [K / 32, N, 2] bfloat16 -> the packed blocks (uint8).
at::Tensor pack(const at::Tensor& q, const at::Tensor& scales_and_zeros) {
  TORCH_CHECK(q.dim() == 2, "ssd_int4::pack: q must be [out, in]");
  const int64_t n = q.size(0), k = q.size(1);
  TORCH_CHECK(n % 16 == 0 && k % 32 == 0, "ssd_int4::pack: out must be a multiple of 16 and in of 32");
  const int64_t groups = k / 32, tiles = n / 16;
  const auto qc = q.to(at::kByte).contiguous();
  const auto szc = scales_and_zeros.to(at::kBFloat16).contiguous();
  TORCH_CHECK(szc.dim() == 3 && szc.size(0) == groups && szc.size(1) == n && szc.size(2) == 2,
              "ssd_int4::pack: scales_and_zeros must be [in / 32, out, 2]");
  auto packed = at::empty({tiles * groups * BLOCK}, at::kByte);
  const uint8_t* qp = qc.data_ptr<uint8_t>();
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(szc.data_ptr<at::BFloat16>());
  uint8_t* pp = packed.data_ptr<uint8_t>();
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t g = 0; g < groups; ++g) {
        uint8_t* block = pp + (t * groups + g) * BLOCK;
        for (int c = 0; c < 4; ++c)
          for (int i = 0; i < 32; ++i) {
            uint16_t word = 0;
            const int64_t row = t * 16 + i / 2;
            for (int j = 0; j < 4; ++j)
              word |= (uint16_t)((qp[row * k + g * 32 + 2 * (4 * c + j) + (i & 1)] & 15) << (4 * j));
            std::memcpy(block + c * 64 + i * 2, &word, 2);
          }
        for (int i = 0; i < 16; ++i) {
          const int64_t at_ = (g * n + t * 16 + i) * 2;
          const uint32_t pair = (uint32_t)sp[at_] | ((uint32_t)sp[at_ + 1] << 16);
          std::memcpy(block + 256 + i * 4, &pair, 4);
        }
      }
  });
  return packed;
}

// x [M, K] bfloat16, packed from pack(), out_features N -> y [M, N] bfloat16; M any, CHUNK rows a pass.
at::Tensor mm(const at::Tensor& x, const at::Tensor& packed, int64_t out_features) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2, "ssd_int4::mm: x must be bfloat16 [rows, in]");
  const auto xc = x.contiguous();
  const int64_t rows = xc.size(0), k = xc.size(1), n = out_features;
  TORCH_CHECK(k % 32 == 0 && n % 16 == 0, "ssd_int4::mm: in must be a multiple of 32 and out of 16");
  const int64_t groups = k / 32, tiles = n / 16;
  TORCH_CHECK(packed.numel() == tiles * groups * BLOCK, "ssd_int4::mm: packed does not match in and out");
  auto y = at::empty({rows, n}, at::kBFloat16);
  const uint16_t* xr = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
  std::vector<float> sums(rows * groups);  // each row's sum of x a group, in a fixed order
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t g = 0; g < groups; ++g) {
      const __m256i* at_ = reinterpret_cast<const __m256i*>(xr + m * k + g * 32);
      const __m512 a = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(at_)), 16));
      const __m512 b = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(at_ + 1)), 16));
      sums[m * groups + g] = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
    }
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const uint32_t* xp = reinterpret_cast<const uint32_t*>(xr);
  uint16_t* out = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  std::vector<uint32_t> pairs;
  std::vector<float> chunk_sums;
  for (int64_t m0 = 0; m0 < rows; m0 += CHUNK) {
    const int chunk = (int)std::min<int64_t>(CHUNK, rows - m0);
    pairs.resize(groups * 16 * chunk);  // [group][pair][row]
    chunk_sums.resize(groups * chunk);
    for (int m = 0; m < chunk; ++m) {
      for (int64_t i = 0; i < groups * 16; ++i) pairs[i * chunk + m] = xp[(m0 + m) * (k / 2) + i];
      for (int64_t g = 0; g < groups; ++g) chunk_sums[g * chunk + m] = sums[(m0 + m) * groups + g];
    }
    at::parallel_for(0, tiles, streams(chunk), [&](int64_t begin, int64_t end) {
      run_rows(chunk, w, groups, begin, end, pairs.data(), chunk_sums.data(), out + m0 * n, n);
    });
  }
  return y;
}

}  // namespace

TORCH_LIBRARY(ssd_int4, m) {
  m.def("pack(Tensor q, Tensor scales_and_zeros) -> Tensor");
  m.def("mm(Tensor x, Tensor packed, int out_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(ssd_int4, CPU, m) {
  m.impl("pack", &pack);
  m.impl("mm", &mm);
}
