// tensor_einsum (binary) and tensor_einsum1 (unary): generic extended einsum over one block pair.
//
// Z[lZ] = AGG over the labels not in lZ of JOIN(X[lX], Y[lY]). Every label gets a loop with a stride per
// operand; the output labels form the outer loops (so Z is written in C order) and the aggregated labels the
// inner loops, accumulated in a register. O(product of label sizes), no per-element allocation or parsing.
#include "dtype.hpp"
#include "functions.hpp"
#include "ops.hpp"
#include "spec.hpp"

namespace tsk {
namespace {

enum class Join { Mul, Add, Sub, Div, SqDiff, AbsDiff, Max, Min };
enum class Agg { Sum, Max, Min, Prod };

constexpr const char *kJoinChoices = "multiply, add, subtract, divide, sqdiff, absdiff, max, min";
constexpr const char *kAggChoices = "sum, max, min, prod";

Join parse_join(const Bytes &s, const char *fn) {
	static const std::pair<const char *, Join> names[] = {
	    {"multiply", Join::Mul}, {"add", Join::Add},         {"subtract", Join::Sub}, {"divide", Join::Div},
	    {"sqdiff", Join::SqDiff}, {"absdiff", Join::AbsDiff}, {"max", Join::Max},      {"min", Join::Min}};
	for (const auto &n : names) {
		if (same_bytes(s, n.first)) {
			return n.second;
		}
	}
	fail(std::string(fn) + ": unknown join '" + s.str() + "' (valid: " + kJoinChoices + ")");
}

Agg parse_agg(const Bytes &s, const char *fn) {
	static const std::pair<const char *, Agg> names[] = {
	    {"sum", Agg::Sum}, {"max", Agg::Max}, {"min", Agg::Min}, {"prod", Agg::Prod}};
	for (const auto &n : names) {
		if (same_bytes(s, n.first)) {
			return n.second;
		}
	}
	fail(std::string(fn) + ": unknown agg '" + s.str() + "' (valid: " + kAggChoices + ")");
}

// ---- join and aggregation functors ----

struct JMul {
	template <class T>
	static T f(T a, T b) {
		return wmul(a, b);
	}
};
struct JAdd {
	template <class T>
	static T f(T a, T b) {
		return wadd(a, b);
	}
};
struct JSub {
	template <class T>
	static T f(T a, T b) {
		return wsub(a, b);
	}
};
struct JDiv {
	template <class T>
	static T f(T a, T b) {
		return wdiv(a, b);
	}
};
struct JSqDiff {
	template <class T>
	static T f(T a, T b) {
		T d = wsub(a, b);
		return wmul(d, d);
	}
};
struct JAbsDiff {
	template <class T>
	static T f(T a, T b) {
		return wabs(wsub(a, b));
	}
};
struct JMax {
	template <class T>
	static T f(T a, T b) {
		return nan_max(a, b);
	}
};
struct JMin {
	template <class T>
	static T f(T a, T b) {
		return nan_min(a, b);
	}
};

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

template <class T, class J, class A, bool BIN>
void kernel(const Plan &p, const T *x, const T *y, T *z) {
	T *zp = z;
	if (p.inner.empty()) { // nothing aggregated: the output is just the join
		odometer(p.outer.data(), p.outer.size(), 0, 0, [&](int64_t ox, int64_t oy) {
			if constexpr (BIN) {
				*zp++ = J::f(x[ox], y[oy]);
			} else {
				(void)oy;
				*zp++ = x[ox];
			}
		});
		return;
	}
	odometer(p.outer.data(), p.outer.size(), 0, 0, [&](int64_t ox, int64_t oy) {
		T acc = A::template identity<T>();
		odometer(p.inner.data(), p.inner.size(), ox, oy, [&](int64_t a, int64_t b) {
			if constexpr (BIN) {
				acc = A::f(acc, J::f(x[a], y[b]));
			} else {
				(void)b;
				acc = A::f(acc, x[a]);
			}
		});
		*zp++ = acc;
	});
}

[[noreturn]] void not_for_complex(const char *fn, const char *what, const char *name, const char *dtype) {
	fail(std::string(fn) + ": " + what + " '" + name + "' is not defined for complex (dtype " + dtype + ")");
}

template <class T, class J, bool BIN>
void run_agg(Agg agg, const Plan &p, const T *x, const T *y, T *z, const char *fn) {
	switch (agg) {
	case Agg::Sum:
		return kernel<T, J, ASum, BIN>(p, x, y, z);
	case Agg::Prod:
		return kernel<T, J, AProd, BIN>(p, x, y, z);
	case Agg::Max:
		if constexpr (is_complex_v<T>) {
			not_for_complex(fn, "agg", "max", name_of<T>());
		} else {
			return kernel<T, J, AMax, BIN>(p, x, y, z);
		}
	case Agg::Min:
		if constexpr (is_complex_v<T>) {
			not_for_complex(fn, "agg", "min", name_of<T>());
		} else {
			return kernel<T, J, AMin, BIN>(p, x, y, z);
		}
	}
}

template <class T>
void run_join(Join join, Agg agg, const Plan &p, const T *x, const T *y, T *z, const char *fn) {
	switch (join) {
	case Join::Mul:
		return run_agg<T, JMul, true>(agg, p, x, y, z, fn);
	case Join::Add:
		return run_agg<T, JAdd, true>(agg, p, x, y, z, fn);
	case Join::Sub:
		return run_agg<T, JSub, true>(agg, p, x, y, z, fn);
	case Join::Div:
		return run_agg<T, JDiv, true>(agg, p, x, y, z, fn);
	case Join::SqDiff:
		return run_agg<T, JSqDiff, true>(agg, p, x, y, z, fn);
	case Join::AbsDiff:
		if constexpr (is_complex_v<T>) {
			not_for_complex(fn, "join", "absdiff", name_of<T>());
		} else {
			return run_agg<T, JAbsDiff, true>(agg, p, x, y, z, fn);
		}
	case Join::Max:
		if constexpr (is_complex_v<T>) {
			not_for_complex(fn, "join", "max", name_of<T>());
		} else {
			return run_agg<T, JMax, true>(agg, p, x, y, z, fn);
		}
	case Join::Min:
		if constexpr (is_complex_v<T>) {
			not_for_complex(fn, "join", "min", name_of<T>());
		} else {
			return run_agg<T, JMin, true>(agg, p, x, y, z, fn);
		}
	}
}

} // namespace

void tensor_einsum(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensor_einsum";
	guard_scalar(info, FN, [&] {
		const idx_t count = duckdb_data_chunk_get_size(input);
		Col spec_c(input, 0), join_c(input, 1), agg_c(input, 2), dtype_c(input, 3), x_c(input, 4);
		ListCol xs_c(input, 5);
		Col y_c(input, 6);
		ListCol ys_c(input, 7);
		Cached<Spec> specs;
		Cached<Join> joins;
		Cached<Agg> aggs;
		DTypeArg dtypes;
		Shape xs, ys;
		AlignedBuf xa, ya, zb;
		static const char *const names[] = {"x", "y"};
		for (idx_t row = 0; row < count; row++) {
			if (!spec_c.valid(row) || !join_c.valid(row) || !agg_c.valid(row) || !dtype_c.valid(row) ||
			    !x_c.valid(row) || !xs_c.valid(row) || !y_c.valid(row) || !ys_c.valid(row)) {
				set_null(output, row);
				continue;
			}
			const Spec &spec = specs.get(spec_c.str(row), [](const Bytes &b) { return parse_spec(b, 2, FN); });
			const Join join = joins.get(join_c.str(row), [](const Bytes &b) { return parse_join(b, FN); });
			const Agg agg = aggs.get(agg_c.str(row), [](const Bytes &b) { return parse_agg(b, FN); });
			const DType dt = dtypes.get(dtype_c.str(row), FN);
			const Bytes xb = x_c.str(row);
			const Bytes yb = y_c.str(row);
			xs_c.get(row, xs, FN, "x_shape");
			ys_c.get(row, ys, FN, "y_shape");
			check_operand(FN, "x", xb, xs, dt);
			check_operand(FN, "y", yb, ys, dt);
			const Shape *shapes[] = {&xs, &ys};
			const Plan plan = make_plan(spec, shapes, names, itemsize(dt), FN);
			const size_t out_bytes = plan.out_numel * itemsize(dt);
			dispatch(dt, [&](auto tag) {
				using T = typename decltype(tag)::type;
				const T *x = aligned_view<T>(xb, xa);
				const T *y = aligned_view<T>(yb, ya);
				T *z = reinterpret_cast<T *>(zb.resize(out_bytes));
				run_join<T>(join, agg, plan, x, y, z, FN);
			});
			set_blob(output, row, zb.data(), out_bytes);
		}
	});
}

void tensor_einsum1(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensor_einsum1";
	guard_scalar(info, FN, [&] {
		const idx_t count = duckdb_data_chunk_get_size(input);
		Col spec_c(input, 0), agg_c(input, 1), dtype_c(input, 2), x_c(input, 3);
		ListCol xs_c(input, 4);
		Cached<Spec> specs;
		Cached<Agg> aggs;
		DTypeArg dtypes;
		Shape xs;
		AlignedBuf xa, zb;
		static const char *const names[] = {"x", "y"};
		for (idx_t row = 0; row < count; row++) {
			if (!spec_c.valid(row) || !agg_c.valid(row) || !dtype_c.valid(row) || !x_c.valid(row) ||
			    !xs_c.valid(row)) {
				set_null(output, row);
				continue;
			}
			const Spec &spec = specs.get(spec_c.str(row), [](const Bytes &b) { return parse_spec(b, 1, FN); });
			const Agg agg = aggs.get(agg_c.str(row), [](const Bytes &b) { return parse_agg(b, FN); });
			const DType dt = dtypes.get(dtype_c.str(row), FN);
			const Bytes xb = x_c.str(row);
			xs_c.get(row, xs, FN, "x_shape");
			check_operand(FN, "x", xb, xs, dt);
			const Shape *shapes[] = {&xs, nullptr};
			const Plan plan = make_plan(spec, shapes, names, itemsize(dt), FN);
			const size_t out_bytes = plan.out_numel * itemsize(dt);
			dispatch(dt, [&](auto tag) {
				using T = typename decltype(tag)::type;
				const T *x = aligned_view<T>(xb, xa);
				T *z = reinterpret_cast<T *>(zb.resize(out_bytes));
				run_agg<T, JMul, false>(agg, plan, x, x, z, FN);
			});
			set_blob(output, row, zb.data(), out_bytes);
		}
	});
}

} // namespace tsk
