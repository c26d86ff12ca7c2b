// Packed single-precision GEMM (see pgemm.hpp): BLIS-style blocking around a 6 x 64 AVX-512 micro-kernel.
//
// Micro-kernel: a C tile of kMR = 6 rows x kNR = 64 columns in 24 zmm accumulators. Each k step loads 4 zmm
// of B and broadcasts 6 values of A: 24 FMAs (12 cycles on two FMA units) for 10 load uops, so the FMA
// units stay the bottleneck. Vectors run along n because C is row-major: the tile goes straight into C
// (masked stores at the edges), without a transposition. On Cascade Lake (256^3, operands cycling through
// L3) 6x64 was as fast as or a few percent faster than 14x32, 12x32 and 8x32, and pads the fewest rows.
//
// Blocking: k in passes of at most kKC steps (C is read and written once per pass; fewer, longer passes
// measured faster), rows in blocks whose packed A (mc x kc) stays in L2. For one B micro-panel (jr) the
// kernel sweeps all A micro-panels of the block (ir), both streaming from L2. jr outside ir spreads the first
// touch of B over the whole product (the next B micro-panel is prefetched into L2 in slices during the
// sweep); with ir outside, all of B is needed in the first sweep, which stalls when the operands come from
// L3 (5-8% slower in measurement).
#include "pgemm.hpp"

#include <immintrin.h>

#include <algorithm>

// For functions that use AVX-512 intrinsics: the project builds without -march.
#define TSK_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,fma")))
#define TSK_AVX512_INLINE __attribute__((target("avx512f,avx512dq,avx512vl,fma"), always_inline)) inline

namespace tsk {
namespace pgemm {

namespace {

constexpr int64_t kMR = 6;
constexpr int kNV = 4; // zmm per tile row
constexpr int64_t kNR = 16 * kNV;
// Longest k pass. A 512-step B micro-panel (128 KiB) and the A block share L2 with the prefetched next panel.
constexpr int64_t kKC = 512;
// Packed A block of one pass (512 KiB, half of L2).
constexpr int64_t kABlockFloats = 128 * 1024;

int64_t ceil_div(int64_t a, int64_t b) {
	return (a + b - 1) / b;
}

// Mask of the first n lanes (n clamped to [0, 16]).
__mmask16 lanes(int64_t n) {
	if (n >= 16) {
		return static_cast<__mmask16>(0xFFFF);
	}
	return n <= 0 ? static_cast<__mmask16>(0) : static_cast<__mmask16>((1u << n) - 1u);
}

// ---- micro-kernel ----

// One k step: acc[i][v] += A[i] * B[v-th vector].
template <int NV>
TSK_AVX512_INLINE void step(__m512 (&acc)[kMR][NV], const float *a, const float *b) {
	__m512 bv[NV];
#pragma GCC unroll 4
	for (int v = 0; v < NV; v++) {
		bv[v] = _mm512_loadu_ps(b + 16 * v);
	}
#pragma GCC unroll 6
	for (int i = 0; i < kMR; i++) {
		const __m512 ai = _mm512_set1_ps(a[i]); // folded into a broadcast load
#pragma GCC unroll 4
		for (int v = 0; v < NV; v++) {
			acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
		}
	}
}

// C tile (mr <= kMR rows, nr <= 16*NV columns at c) = (load_c ? C : 0) + A micro-panel * B micro-panel over kc
// steps. NV < kNV serves a narrow last column panel (its B rows keep the kNR stride). Also prefetches npf
// cache lines from pf into L2, one per two k steps: the driver's slice of the next B micro-panel.
template <int NV>
TSK_AVX512 void kernel(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int64_t mr, int64_t nr,
                       bool load_c, const char *pf, int64_t npf) {
	__m512 acc[kMR][NV];
#pragma GCC unroll 6
	for (int i = 0; i < kMR; i++) {
#pragma GCC unroll 4
		for (int v = 0; v < NV; v++) {
			acc[i][v] = _mm512_setzero_ps();
		}
	}
	// The tile is needed only after the k loop: start its (likely L3) misses now.
	for (int64_t i = 0; i < mr; i++) {
		const char *ci = reinterpret_cast<const char *>(c + i * ldc);
		for (int64_t off = 0; off < nr; off += 16) {
			_mm_prefetch(ci + 4 * off, _MM_HINT_T0);
		}
		_mm_prefetch(ci + 4 * (nr - 1), _MM_HINT_T0); // c need not be 64-byte aligned
	}
	int64_t p = 0;
	for (; p + 2 <= kc; p += 2) {
		if (npf > 0) {
			_mm_prefetch(pf, _MM_HINT_T1);
			pf += 64;
			npf--;
		}
		step<NV>(acc, a + p * kMR, b + p * kNR);
		step<NV>(acc, a + (p + 1) * kMR, b + (p + 1) * kNR);
	}
	if (p < kc) {
		step<NV>(acc, a + p * kMR, b + p * kNR);
	}
	// Unrolled with a run-time guard rather than a loop to mr, so acc stays in registers.
#pragma GCC unroll 6
	for (int i = 0; i < kMR; i++) {
		if (i < mr) {
			float *ci = c + i * ldc;
#pragma GCC unroll 4
			for (int v = 0; v < NV; v++) {
				if (16 * v < nr) {
					const __mmask16 mk = lanes(nr - 16 * v);
					__m512 x = acc[i][v];
					if (load_c) {
						x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mk, ci + 16 * v));
					}
					_mm512_mask_storeu_ps(ci + 16 * v, mk, x);
				}
			}
		}
	}
}

TSK_AVX512 void gemm_avx512(int64_t m, int64_t n, int64_t k, const float *pa, const float *pb, float *c, int64_t ldc,
                            bool accumulate) {
	// Equal passes (k = 600 runs as 2 x 300, not 512 + 88).
	const int64_t npass = ceil_div(k, kKC), kcb = ceil_div(k, npass);
	for (int64_t pc = 0; pc < k; pc += kcb) {
		const int64_t kc = std::min(kcb, k - pc);
		const bool load_c = accumulate || pc > 0;
		// Row blocks of equal size (whole micro-panels) whose packed A fits kABlockFloats.
		const int64_t mcmax = std::max<int64_t>(1, kABlockFloats / (kc * kMR)) * kMR;
		const int64_t mcb = ceil_div(ceil_div(m, ceil_div(m, mcmax)), kMR) * kMR;
		for (int64_t ic = 0; ic < m; ic += mcb) {
			const int64_t nir = ceil_div(std::min(mcb, m - ic), kMR);
			for (int64_t jr = 0; jr < n; jr += kNR) {
				const int64_t nr = std::min(kNR, n - jr);
				const float *bp = pb + jr * k + pc * kNR; // panel jr / kNR, step pc
				// This pass's part of the next B micro-panel, in equal slices over the nir kernel calls.
				const bool next = jr + kNR < n;
				const char *nb = next ? reinterpret_cast<const char *>(bp + kNR * k) : nullptr;
				const int64_t lines = next ? kc * kNR * 4 / 64 : 0;
				const int64_t slice = ceil_div(lines, nir);
				for (int64_t t = 0; t < nir; t++) {
					const int64_t ir = ic + t * kMR;
					const float *ap = pa + ir * k + pc * kMR;
					float *ct = c + ir * ldc + jr;
					const int64_t mr = std::min(kMR, m - ir);
					const int64_t l0 = std::min(lines, t * slice), cnt = std::min(slice, lines - l0);
					const char *pf = cnt > 0 ? nb + 64 * l0 : nullptr;
					switch (ceil_div(nr, 16)) {
					case 4:
						kernel<4>(kc, ap, bp, ct, ldc, mr, nr, load_c, pf, cnt);
						break;
					case 3:
						kernel<3>(kc, ap, bp, ct, ldc, mr, nr, load_c, pf, cnt);
						break;
					case 2:
						kernel<2>(kc, ap, bp, ct, ldc, mr, nr, load_c, pf, cnt);
						break;
					default:
						kernel<1>(kc, ap, bp, ct, ldc, mr, nr, load_c, pf, cnt);
						break;
					}
				}
			}
		}
	}
}

// Without AVX-512 (callers normally use OpenBLAS then): correct, slow.
void gemm_portable(int64_t m, int64_t n, int64_t k, const float *pa, const float *pb, float *c, int64_t ldc,
                   bool accumulate) {
	for (int64_t i = 0; i < m; i++) {
		const float *ap = pa + (i / kMR) * kMR * k + i % kMR;
		for (int64_t j = 0; j < n; j++) {
			const float *bp = pb + (j / kNR) * kNR * k + j % kNR;
			float s = 0.0f;
			for (int64_t p = 0; p < k; p++) {
				s += ap[p * kMR] * bp[p * kNR];
			}
			float &cij = c[i * ldc + j];
			cij = accumulate ? cij + s : s;
		}
	}
}

// ---- packing ----

static_assert(kMR == 6 && kNR == 64, "the packers below are written for 6 x 64 micro-panels");

// Row-major A: 16 steps of a 6-row panel are 96 consecutive floats, element f = 6p + i taken from row i,
// step p. Output vector j (lanes f = 16j .. 16j+15) is built from the row pairs (0,1), (2,3), (4,5) with one
// vpermt2ps each (index p + 16*(i odd), the same for every pair) and blended by the lanes' pair.
struct Interleave6 {
	int32_t idx[6][16];
	uint16_t pair_mask[6][3];
};

constexpr Interleave6 make_interleave6() {
	Interleave6 t {};
	for (int j = 0; j < 6; j++) {
		for (int l = 0; l < 16; l++) {
			const int f = 16 * j + l, p = f / 6, i = f % 6;
			t.idx[j][l] = p + 16 * (i % 2);
			t.pair_mask[j][i / 2] = static_cast<uint16_t>(t.pair_mask[j][i / 2] | (1u << l));
		}
	}
	return t;
}

constexpr Interleave6 kInterleave6 = make_interleave6();

// A element (i, p) at a[i*rs + p].
TSK_AVX512 void pack_a_rows(const float *a, int64_t rs, int64_t m, int64_t k, float *out) {
	__m512i idx[6];
	for (int j = 0; j < 6; j++) {
		idx[j] = _mm512_loadu_si512(kInterleave6.idx[j]);
	}
	for (int64_t ir = 0; ir < m; ir += kMR, out += kMR * k) {
		const int64_t r = std::min(kMR, m - ir);
		for (int64_t p0 = 0; p0 < k; p0 += 16) {
			const int64_t kt = std::min<int64_t>(16, k - p0);
			const __mmask16 km = lanes(kt);
			__m512 row[6];
#pragma GCC unroll 6
			for (int i = 0; i < 6; i++) {
				row[i] = i < r ? _mm512_maskz_loadu_ps(km, a + (ir + i) * rs + p0) : _mm512_setzero_ps();
			}
			// The next panel's rows, one chunk ahead: 6 fresh streams per panel are too many for the hardware
			// prefetcher to ramp up on from L3/DRAM (1.4x slower without).
			for (int64_t i = ir + kMR; i < std::min(m, ir + 2 * kMR); i++) {
				_mm_prefetch(reinterpret_cast<const char *>(a + i * rs + p0), _MM_HINT_T0);
			}
			float *o = out + p0 * kMR;
			const int64_t valid = kt * kMR;
#pragma GCC unroll 6
			for (int j = 0; j < 6; j++) {
				if (16 * j < valid) {
					__m512 v = _mm512_permutex2var_ps(row[0], idx[j], row[1]);
					const __m512 v23 = _mm512_permutex2var_ps(row[2], idx[j], row[3]);
					const __m512 v45 = _mm512_permutex2var_ps(row[4], idx[j], row[5]);
					v = _mm512_mask_mov_ps(v, kInterleave6.pair_mask[j][1], v23);
					v = _mm512_mask_mov_ps(v, kInterleave6.pair_mask[j][2], v45);
					_mm512_mask_storeu_ps(o + 16 * j, lanes(valid - 16 * j), v);
				}
			}
		}
	}
}

// A element (i, p) at a[i + p*cs]: each step's panel column is contiguous. Steps in chunks of 16 outside the
// panels: a cache line of a column serves 2-3 panels, and sweeping one panel over all k first evicted it
// (columns 2^k apart share few L1 sets), 2x slower.
// Full panels go 8 steps (48 floats, 3 vectors) at a time, step q into lanes [6q, 6q+6) by expand-loads
// (consecutive floats into the masked lanes; steps 2 and 5 straddle two vectors): half the time of one
// 6-lane masked load and store per step.
TSK_AVX512 void pack_a_cols(const float *a, int64_t cs, int64_t m, int64_t k, float *out) {
	const __mmask16 full = lanes(kMR);
	for (int64_t p0 = 0; p0 < k; p0 += 16) {
		const int64_t p1 = std::min<int64_t>(k, p0 + 16);
		for (int64_t ir = 0; ir < m; ir += kMR) {
			const float *src = a + ir;
			float *o = out + ir * k;
			// The next chunk's 16 columns at this panel's last row: every source line gets fetched a chunk
			// ahead (1.3-1.8x faster from L3/DRAM); repeats for lines shared by panels are cheap hits.
			const float *last = src + std::min(kMR, m - ir) - 1;
			for (int64_t q = p1; q < std::min<int64_t>(k, p1 + 16); q++) {
				_mm_prefetch(reinterpret_cast<const char *>(last + q * cs), _MM_HINT_T0);
			}
			int64_t p = p0;
			if (m - ir >= kMR) {
				for (; p + 8 <= p1; p += 8) {
					const float *s = src + p * cs;
					__m512 v0 = _mm512_maskz_loadu_ps(0x003F, s);
					v0 = _mm512_mask_expandloadu_ps(v0, 0x0FC0, s + cs);
					v0 = _mm512_mask_expandloadu_ps(v0, 0xF000, s + 2 * cs);
					__m512 v1 = _mm512_maskz_loadu_ps(0x0003, s + 2 * cs + 4);
					v1 = _mm512_mask_expandloadu_ps(v1, 0x00FC, s + 3 * cs);
					v1 = _mm512_mask_expandloadu_ps(v1, 0x3F00, s + 4 * cs);
					v1 = _mm512_mask_expandloadu_ps(v1, 0xC000, s + 5 * cs);
					__m512 v2 = _mm512_maskz_loadu_ps(0x000F, s + 5 * cs + 2);
					v2 = _mm512_mask_expandloadu_ps(v2, 0x03F0, s + 6 * cs);
					v2 = _mm512_mask_expandloadu_ps(v2, 0xFC00, s + 7 * cs);
					_mm512_storeu_ps(o + p * kMR, v0);
					_mm512_storeu_ps(o + p * kMR + 16, v1);
					_mm512_storeu_ps(o + p * kMR + 32, v2);
				}
			}
			const __mmask16 mk = lanes(m - ir);
			for (; p < p1; p++) {
				_mm512_mask_storeu_ps(o + p * kMR, full, _mm512_maskz_loadu_ps(mk, src + p * cs));
			}
		}
	}
}

// B element (p, j) at b[p*rs + j]: each step's panel row is contiguous. Steps outside panels, so the
// source is read row by row like a memcpy (panel by panel took 1.6x as long from L3/DRAM).
TSK_AVX512 void pack_b_rows(const float *b, int64_t rs, int64_t k, int64_t n, float *out) {
	for (int64_t p = 0; p < k; p++) {
		const float *src = b + p * rs;
		for (int64_t jr = 0; jr < n; jr += kNR) {
			const int64_t nr = std::min(kNR, n - jr);
			float *o = out + jr * k + p * kNR;
#pragma GCC unroll 4
			for (int v = 0; v < kNV; v++) {
				const __m512 x =
				    16 * v < nr ? _mm512_maskz_loadu_ps(lanes(nr - 16 * v), src + jr + 16 * v) : _mm512_setzero_ps();
				_mm512_storeu_ps(o + 16 * v, x);
			}
		}
	}
}

// In-register transpose: r[q] lane l <- r[l] lane q. The zero-masked forms with a full mask compile to the
// plain instructions; the plain intrinsics trip GCC 12's -Wmaybe-uninitialized (PR105593) when inlined.
TSK_AVX512_INLINE void transpose16(__m512 (&r)[16]) {
	constexpr __mmask16 all = 0xFFFF;
	__m512 t[16], u[16];
	for (int q = 0; q < 8; q++) { // within 128-bit lanes: pairs of rows interleaved
		t[2 * q] = _mm512_maskz_unpacklo_ps(all, r[2 * q], r[2 * q + 1]);
		t[2 * q + 1] = _mm512_maskz_unpackhi_ps(all, r[2 * q], r[2 * q + 1]);
	}
	for (int s = 0; s < 4; s++) { // u[4s+c] lane L = rows 4s..4s+3 of column 4L+c
		u[4 * s] = _mm512_maskz_shuffle_ps(all, t[4 * s], t[4 * s + 2], 0x44);
		u[4 * s + 1] = _mm512_maskz_shuffle_ps(all, t[4 * s], t[4 * s + 2], 0xEE);
		u[4 * s + 2] = _mm512_maskz_shuffle_ps(all, t[4 * s + 1], t[4 * s + 3], 0x44);
		u[4 * s + 3] = _mm512_maskz_shuffle_ps(all, t[4 * s + 1], t[4 * s + 3], 0xEE);
	}
	for (int c = 0; c < 4; c++) { // collect the four row groups' 128-bit lanes of column 4L+c
		const __m512 v0 = _mm512_maskz_shuffle_f32x4(all, u[c], u[4 + c], 0x88);
		const __m512 v1 = _mm512_maskz_shuffle_f32x4(all, u[c], u[4 + c], 0xDD);
		const __m512 w0 = _mm512_maskz_shuffle_f32x4(all, u[8 + c], u[12 + c], 0x88);
		const __m512 w1 = _mm512_maskz_shuffle_f32x4(all, u[8 + c], u[12 + c], 0xDD);
		r[c] = _mm512_maskz_shuffle_f32x4(all, v0, w0, 0x88);
		r[4 + c] = _mm512_maskz_shuffle_f32x4(all, v1, w1, 0x88);
		r[8 + c] = _mm512_maskz_shuffle_f32x4(all, v0, w0, 0xDD);
		r[12 + c] = _mm512_maskz_shuffle_f32x4(all, v1, w1, 0xDD);
	}
}

// B element (p, j) at b[p + j*cs]: 16 x 16 blocks (16 columns, 16 steps) transposed in registers. Loading
// whole cache lines of 16 columns avoids the L1 set conflicts of walking 64 columns with a 2^k stride.
TSK_AVX512 void pack_b_cols(const float *b, int64_t cs, int64_t k, int64_t n, float *out) {
	for (int64_t jr = 0; jr < n; jr += kNR, out += kNR * k) {
		const int64_t nr = std::min(kNR, n - jr);
		for (int64_t g = 0; g < kNR; g += 16) {
			for (int64_t p0 = 0; p0 < k; p0 += 16) {
				const int64_t kt = std::min<int64_t>(16, k - p0);
				const __mmask16 km = lanes(kt);
				__m512 r[16];
				if (p0 + 64 < k) { // 16 column streams, fetched 4 chunks ahead
					for (int64_t q = 0; q < 16 && g + q < nr; q++) {
						_mm_prefetch(reinterpret_cast<const char *>(b + (jr + g + q) * cs + p0 + 64), _MM_HINT_T0);
					}
				}
				for (int64_t q = 0; q < 16; q++) {
					r[q] = g + q < nr ? _mm512_maskz_loadu_ps(km, b + (jr + g + q) * cs + p0) : _mm512_setzero_ps();
				}
				transpose16(r);
				for (int64_t q = 0; q < kt; q++) {
					_mm512_storeu_ps(out + (p0 + q) * kNR + g, r[q]);
				}
			}
		}
	}
}

// General strides, or no AVX-512.
void pack_a_portable(const float *a, int64_t rs, int64_t cs, int64_t m, int64_t k, float *out) {
	for (int64_t ir = 0; ir < m; ir += kMR, out += kMR * k) {
		const int64_t r = std::min(kMR, m - ir);
		for (int64_t p = 0; p < k; p++) {
			for (int64_t i = 0; i < kMR; i++) {
				out[p * kMR + i] = i < r ? a[(ir + i) * rs + p * cs] : 0.0f;
			}
		}
	}
}

void pack_b_portable(const float *b, int64_t rs, int64_t cs, int64_t k, int64_t n, float *out) {
	for (int64_t jr = 0; jr < n; jr += kNR, out += kNR * k) {
		const int64_t nr = std::min(kNR, n - jr);
		for (int64_t p = 0; p < k; p++) {
			for (int64_t j = 0; j < kNR; j++) {
				out[p * kNR + j] = j < nr ? b[p * rs + (jr + j) * cs] : 0.0f;
			}
		}
	}
}

} // namespace

bool supported() {
	static const bool ok = [] {
		__builtin_cpu_init();
		return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
		       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
	}();
	return ok;
}

size_t packed_a_floats(int64_t m, int64_t k) {
	return m <= 0 || k <= 0 ? 0 : static_cast<size_t>(ceil_div(m, kMR) * kMR * k);
}

size_t packed_b_floats(int64_t k, int64_t n) {
	return k <= 0 || n <= 0 ? 0 : static_cast<size_t>(ceil_div(n, kNR) * kNR * k);
}

void pack_a(const float *a, int64_t rs, int64_t cs, int64_t m, int64_t k, float *out) {
	if (m <= 0 || k <= 0) {
		return;
	}
	if (supported() && cs == 1) {
		pack_a_rows(a, rs, m, k, out);
	} else if (supported() && rs == 1) {
		pack_a_cols(a, cs, m, k, out);
	} else {
		pack_a_portable(a, rs, cs, m, k, out);
	}
}

void pack_b(const float *b, int64_t rs, int64_t cs, int64_t k, int64_t n, float *out) {
	if (k <= 0 || n <= 0) {
		return;
	}
	if (supported() && cs == 1) {
		pack_b_rows(b, rs, k, n, out);
	} else if (supported() && rs == 1) {
		pack_b_cols(b, cs, k, n, out);
	} else {
		pack_b_portable(b, rs, cs, k, n, out);
	}
}

void gemm_packed(int64_t m, int64_t n, int64_t k, const float *pa, const float *pb, float *c, int64_t ldc,
                 bool accumulate) {
	if (m <= 0 || n <= 0) {
		return;
	}
	if (k <= 0) {
		if (!accumulate) {
			for (int64_t i = 0; i < m; i++) {
				std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
			}
		}
		return;
	}
	if (supported()) {
		gemm_avx512(m, n, k, pa, pb, c, ldc, accumulate);
	} else {
		gemm_portable(m, n, k, pa, pb, c, ldc, accumulate);
	}
}

} // namespace pgemm
} // namespace tsk

#undef TSK_AVX512
#undef TSK_AVX512_INLINE
