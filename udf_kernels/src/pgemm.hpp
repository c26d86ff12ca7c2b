// Single-precision GEMM over pre-packed operands (AVX-512), for callers that reuse one block in many products:
// OpenBLAS repacks both operands on every call (~17% of a 256^3 product); here a block is packed once with
// pack_a / pack_b and every gemm_packed call reads the packed copies directly.
//
// Packed A: MR-row micro-panels (rows [r, r+MR)), each k steps of MR floats (the rows' values at step p).
// Packed B: NR-column micro-panels, each k steps of NR floats. Partial panels are zero-padded, so the sizes
// are whole panels (packed_*_floats); the layout does not depend on how gemm_packed later blocks k.
//
// gemm_packed needs AVX-512F/DQ/VL + FMA at run time (supported(); callers use OpenBLAS otherwise, though a
// slow portable loop keeps it correct anywhere). Everything is reentrant: no state besides the CPU check.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tsk {
namespace pgemm {

// AVX-512F/DQ/VL and FMA usable (CPU and OS) at run time.
bool supported();

// Floats of the packed copy of an m x k A / k x n B (0 when a size is <= 0).
size_t packed_a_floats(int64_t m, int64_t k);
size_t packed_b_floats(int64_t k, int64_t n);

// A element (i, p) is a[i*rs + p*cs] (any strides: row-major, column-major, general). out: packed_a_floats
// floats, 64-byte aligned.
void pack_a(const float *a, int64_t rs, int64_t cs, int64_t m, int64_t k, float *out);
// B element (p, j) is b[p*rs + j*cs]. out: packed_b_floats floats, 64-byte aligned.
void pack_b(const float *b, int64_t rs, int64_t cs, int64_t k, int64_t n, float *out);

// C (m x n, element (i, j) at c[i*ldc + j]) = (accumulate ? C : 0) + A*B from the packed operands, which
// must have been packed with the same m, n, k. Only the m x n elements of C are read or written.
void gemm_packed(int64_t m, int64_t n, int64_t k, const float *pa, const float *pb, float *c, int64_t ldc,
                 bool accumulate);

} // namespace pgemm
} // namespace tsk
