// Strided block copies that move contiguous runs instead of single elements.
//
// permute_into(L, n, src, dst, op) applies op(dst[i], src[o_i]) for every index combination of the loops
// L[0..n) in C order, dst being contiguous in that order and o_i the offset given by the loops' source
// strides (Loop::sx); it is the same walk as odometer() with a running output pointer. Loops of size 1 are
// dropped and neighbours that are contiguous in the source are fused. Then
//   * when the innermost loop has source stride 1, each innermost run is one contiguous copy (memcpy for
//     plain assignment);
//   * when another loop p has source stride 1, loops p and the innermost one are moved as a cache-blocked
//     2-D transpose (tiles of kTile x kTile), the remaining loops walked around it;
//   * otherwise (diagonals, every stride > 1) the innermost loop stays an element loop.
// All offsets must already be validated by the caller (the loops come from validated shapes).
#pragma once

#include "spec.hpp"

#include <cstring>
#include <type_traits>

namespace tsk {

struct Assign {
	template <class T>
	void operator()(T &d, const T &s) const {
		d = s;
	}
};

namespace permute_detail {

constexpr int64_t kTile = 32;

// A loop with its strides in the source (sx) and the destination (sy).
struct Dim {
	int64_t size, s, d;
};

// Fused, size-1-free loops; false when a loop is empty (nothing to do).
inline bool normalize(const Loop *L, size_t n, std::vector<Dim> &dims) {
	dims.clear();
	std::vector<Dim> rev;
	for (size_t k = n; k-- > 0;) {
		if (L[k].size == 0) {
			return false;
		}
		if (L[k].size != 1) {
			rev.push_back(Dim {L[k].size, L[k].sx, L[k].sy});
		}
	}
	for (size_t k = rev.size(); k-- > 0;) {
		const Dim &x = rev[k];
		if (!dims.empty()) {
			Dim &prev = dims.back(); // the outer neighbour of x
			if (prev.s == x.s * x.size && prev.d == x.d * x.size) {
				prev.size *= x.size;
				prev.s = x.s;
				prev.d = x.d;
				continue;
			}
		}
		dims.push_back(x);
	}
	return true;
}

// Walks every combination of dims (outer loops), calling body(src_offset, dst_offset).
template <class Body>
inline void walk(const std::vector<Dim> &dims, Body &&body) {
	std::vector<Loop> loops;
	loops.reserve(dims.size());
	for (const Dim &x : dims) {
		loops.push_back(Loop {x.size, x.s, x.d});
	}
	odometer(loops.data(), loops.size(), 0, 0, body);
}

} // namespace permute_detail

// op(dst[o_dst], src[o_src]) over the loops L[0..n), Loop::sx the source and Loop::sy the destination stride.
// The destination offsets must be distinct (no loop with sy == 0 and size > 1).
template <class T, class Op = Assign>
void strided_copy(const Loop *L, size_t n, const T *src, T *dst, Op op = Op {}) {
	using namespace permute_detail;
	std::vector<Dim> dims;
	if (!normalize(L, n, dims)) {
		return;
	}
	if (dims.empty()) {
		op(dst[0], src[0]);
		return;
	}
	const Dim last = dims.back();
	dims.pop_back();
	if (last.d != 1) { // the destination is not contiguous innermost (not produced by this module's callers)
		walk(dims, [&](int64_t so, int64_t dof) {
			for (int64_t j = 0; j < last.size; j++) {
				op(dst[dof + j * last.d], src[so + j * last.s]);
			}
		});
		return;
	}
	if (last.s == 1) {
		const int64_t run = last.size;
		walk(dims, [&](int64_t so, int64_t dof) {
			const T *s = src + so;
			T *d = dst + dof;
			if constexpr (std::is_same_v<Op, Assign>) {
				std::memcpy(static_cast<void *>(d), static_cast<const void *>(s), static_cast<size_t>(run) * sizeof(T));
			} else {
				for (int64_t j = 0; j < run; j++) {
					op(d[j], s[j]);
				}
			}
		});
		return;
	}
	size_t p = dims.size();
	for (size_t k = dims.size(); k-- > 0;) {
		if (dims[k].s == 1) {
			p = k;
			break;
		}
	}
	if (p == dims.size()) {
		walk(dims, [&](int64_t so, int64_t dof) {
			const T *s = src + so;
			T *d = dst + dof;
			for (int64_t j = 0; j < last.size; j++) {
				op(d[j], s[j * last.s]);
			}
		});
		return;
	}
	const Dim pd = dims[p];
	dims.erase(dims.begin() + static_cast<std::ptrdiff_t>(p));
	const int64_t ls = last.s, pdst = pd.d;
	walk(dims, [&](int64_t so, int64_t dof) {
		const T *s = src + so;
		T *d = dst + dof;
		for (int64_t i0 = 0; i0 < pd.size; i0 += kTile) {
			const int64_t i1 = std::min<int64_t>(i0 + kTile, pd.size);
			for (int64_t j0 = 0; j0 < last.size; j0 += kTile) {
				const int64_t j1 = std::min<int64_t>(j0 + kTile, last.size);
				for (int64_t i = i0; i < i1; i++) {
					T *dr = d + i * pdst;
					const T *sr = s + i;
					for (int64_t j = j0; j < j1; j++) {
						op(dr[j], sr[j * ls]);
					}
				}
			}
		}
	});
}

// The common case: dst contiguous in the loops' C order (Loop::sy is ignored).
template <class T, class Op = Assign>
void permute_into(const Loop *L, size_t n, const T *src, T *dst, Op op = Op {}) {
	std::vector<Loop> loops(L, L + n);
	int64_t st = 1;
	for (size_t k = n; k-- > 0;) {
		loops[k].sy = st;
		st *= loops[k].size;
	}
	strided_copy(loops.data(), n, src, dst, op);
}

} // namespace tsk
