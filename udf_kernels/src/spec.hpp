// Einsum spec parsing ('ij,jk->ik') and the per-call loop plan built from the operand shapes.
#pragma once

#include "common.hpp"
#include "ops.hpp"

#include <array>

namespace tsk {

constexpr int kNumLabels = 52; // a-z, A-Z

inline char label_char(int l) {
	return static_cast<char>(l < 26 ? 'a' + l : 'A' + (l - 26));
}

inline int label_index(char c) {
	if (c >= 'a' && c <= 'z') {
		return c - 'a';
	}
	if (c >= 'A' && c <= 'Z') {
		return 26 + (c - 'A');
	}
	return -1;
}

// A parsed spec: the label strings of 1 or 2 inputs and of the output.
struct Spec {
	int n_inputs = 0;
	std::string inputs[2];
	std::string output;
	std::string text;
};

// Parses "lX,lY->lZ" (n_inputs == 2) or "lX->lZ" (n_inputs == 1). Spaces are ignored.
Spec parse_spec(const Bytes &s, int n_inputs, const char *fn);

// One loop of the einsum: a label's size and its element stride in each operand (0 where absent;
// repeated labels within an operand add their strides, which walks the diagonal).
struct Loop {
	int64_t size = 0;
	int64_t sx = 0;
	int64_t sy = 0;
};

struct Plan {
	std::vector<Loop> outer; // output labels, in output order (so the output is written sequentially)
	std::vector<Loop> inner; // aggregated labels
	std::string inner_labels; // their label letters, in the order of inner
	Shape out_shape;
	uint64_t out_numel = 0;
};

// Validates ranks and label sizes against the shapes and builds the loop plan.
// names[i] is the argument name used in messages ("x", "y").
Plan make_plan(const Spec &spec, const Shape *const shapes[], const char *const names[], size_t itemsize,
               const char *fn);

// Calls body(ox, oy) for every index combination of the loops L[0..n), with the operand offsets.
template <class Body>
inline void odometer(const Loop *L, size_t n, int64_t bx, int64_t by, Body &&body) {
	if (n == 0) {
		body(bx, by);
		return;
	}
	for (size_t k = 0; k < n; k++) {
		if (L[k].size == 0) {
			return;
		}
	}
	int64_t idx[kNumLabels] = {};
	int64_t ox = bx;
	int64_t oy = by;
	const Loop &last = L[n - 1];
	while (true) {
		int64_t ix = ox;
		int64_t iy = oy;
		for (int64_t t = 0; t < last.size; t++) {
			body(ix, iy);
			ix += last.sx;
			iy += last.sy;
		}
		size_t k = n - 1;
		while (true) {
			if (k == 0) {
				return;
			}
			--k;
			ox += L[k].sx;
			oy += L[k].sy;
			if (++idx[k] < L[k].size) {
				break;
			}
			ox -= L[k].sx * L[k].size;
			oy -= L[k].sy * L[k].size;
			idx[k] = 0;
		}
	}
}

// numpy's rule for a reduction over an empty label: the aggregation's identity where it has one (sum: 0, prod: 1);
// max and min have none, and fail as numpy's do (on complex, they fail as undefined first).
inline void check_empty_reduction(const Plan &p, Agg agg, DType dt, const char *fn) {
	const char *np_name = agg_without_identity(agg);
	if (np_name == nullptr || (is_complex_dtype(dt) && !agg_complex(agg))) {
		return;
	}
	for (size_t i = 0; i < p.inner.size(); i++) {
		if (p.inner[i].size == 0) {
			fail(std::string(fn) + ": agg '" + agg_name(agg) + "' reduces over label '" + p.inner_labels[i] +
			     "' of size 0 and has no identity (numpy: zero-size array to reduction operation " + np_name +
			     " which has no identity)");
		}
	}
}

} // namespace tsk
