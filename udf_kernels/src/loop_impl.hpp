// The templates of the generic strided loop (loop.hpp), included by the translation units that instantiate
// them (loop_float.cpp, loop_int.cpp).
#pragma once

#include "loop.hpp"
#include "pairwise.hpp"
#include "permute.hpp"

namespace tsk {
namespace loop_detail {

// The A-reduction over the inner loops of J(x, y) (of x alone when !BIN) at output offsets (ox, oy); not empty.
// A float or complex sum is summed pairwise (pairwise.hpp), like numpy's.
template <class T, class J, class A, bool BIN>
inline T reduce_inner(const Plan &p, const T *x, const T *y, int64_t ox, int64_t oy) {
	const auto value = [&](int64_t a, int64_t b) {
		if constexpr (BIN) {
			return J::f(x[a], y[b]);
		} else {
			(void)b;
			return x[a];
		}
	};
	if constexpr (std::is_same_v<A, ASum> && kPairwise<T>) {
		return pairwise_over<T>(p.inner.data(), p.inner.size(), ox, oy, value);
	} else {
		T acc = A::template identity<T>();
		odometer(p.inner.data(), p.inner.size(), ox, oy, [&](int64_t a, int64_t b) {
			if constexpr (BIN) {
				acc = A::f(acc, J::f(x[a], y[b]));
			} else {
				(void)b;
				acc = A::f(acc, x[a]);
			}
		});
		return acc;
	}
}

// z[i] = r, or with `accumulate` A(z[i], r), for r the A-reduction over the inner loops of J(x, y) at output
// element i. Not inlined into kernel(): inlined there, the max/min loops measured ~15% slower.
template <class T, class J, class A, bool BIN>
[[gnu::noinline]] void reduce_all(const Plan &p, const T *x, const T *y, T *z, bool accumulate) {
	odometer(p.outer.data(), p.outer.size(), 0, 0, [&](int64_t ox, int64_t oy) {
		const T r = reduce_inner<T, J, A, BIN>(p, x, y, ox, oy);
		*z = accumulate ? A::f(*z, r) : r;
		z++;
	});
}

// z[i] = J(x[i * sx], y[i * sy]) for i in [0, n) (x[i * sx] alone when !BIN): unit and zero strides spelled out,
// so the compiler vectorizes them (the general strided loop measured ~7 ns per element of a 'ab,->ab' join).
template <class T, class J, bool BIN>
inline void join_row(const T *x, const T *y, T *z, int64_t n, int64_t sx, int64_t sy) {
	if (n <= 0) { // an empty row: x and y may hold no element at all
		return;
	}
	if constexpr (BIN) {
		if (sx == 1 && sy == 1) {
			for (int64_t i = 0; i < n; i++) {
				z[i] = J::f(x[i], y[i]);
			}
		} else if (sx == 1 && sy == 0) {
			const T b = y[0];
			for (int64_t i = 0; i < n; i++) {
				z[i] = J::f(x[i], b);
			}
		} else if (sx == 0 && sy == 1) {
			const T a = x[0];
			for (int64_t i = 0; i < n; i++) {
				z[i] = J::f(a, y[i]);
			}
		} else {
			for (int64_t i = 0; i < n; i++) {
				z[i] = J::f(x[i * sx], y[i * sy]);
			}
		}
	} else {
		(void)y;
		(void)sy;
		for (int64_t i = 0; i < n; i++) {
			z[i] = x[i * sx];
		}
	}
}

// z = the A-reduction over the inner loops of J(x, y) (of x alone when !BIN), or with `accumulate`
// z[i] = A(z[i], that reduction): the fused form of tensor_<agg>(tensor_einsum(...)). A runtime flag rather than
// a template parameter: the kernels are instantiated for every dtype x join x agg, and the branch is per element
// of the output, never in the reduction.
template <class T, class J, class A, bool BIN>
void kernel(const Plan &p, const T *x, const T *y, T *z, bool accumulate) {
	T *zp = z;
	if constexpr (!BIN) {
		if (p.inner.empty() && !accumulate) { // a unary einsum without reduction is a permutation (diagonals too)
			permute_into(p.outer.data(), p.outer.size(), x, z);
			return;
		}
	}
	if (p.inner.empty() && !accumulate && !p.outer.empty()) { // the join alone, a row of the last label at a time
		const Loop &last = p.outer.back();
		odometer(p.outer.data(), p.outer.size() - 1, 0, 0, [&](int64_t ox, int64_t oy) {
			join_row<T, J, BIN>(x + ox, y + oy, zp, last.size, last.sx, last.sy);
			zp += last.size;
		});
		return;
	}
	if (p.inner.empty()) { // nothing aggregated: the output is just the join
		odometer(p.outer.data(), p.outer.size(), 0, 0, [&](int64_t ox, int64_t oy) {
			T v;
			if constexpr (BIN) {
				v = J::f(x[ox], y[oy]);
			} else {
				(void)oy;
				v = x[ox];
			}
			*zp = accumulate ? A::f(*zp, v) : v;
			zp++;
		});
		return;
	}
	reduce_all<T, J, A, BIN>(p, x, y, z, accumulate);
}

template <class T, class J, bool BIN>
void run_agg(Agg agg, const Plan &p, const T *x, const T *y, T *z, bool accumulate, const char *fn) {
	with_agg(agg, [&](auto tag) {
		using A = decltype(tag);
		if constexpr (is_complex_v<T> && !A::kComplex) {
			not_for_complex(fn, "agg", A::kName, name_of<T>());
		} else {
			kernel<T, J, A, BIN>(p, x, y, z, accumulate);
		}
	});
}

template <class T>
void run_join(Join join, Agg agg, const Plan &p, const T *x, const T *y, T *z, bool accumulate, const char *fn) {
	with_join(join, [&](auto tag) {
		using J = decltype(tag);
		if constexpr (is_complex_v<T> && !J::kComplex) {
			not_for_complex(fn, "join", J::kName, name_of<T>());
		} else {
			run_agg<T, J, true>(agg, p, x, y, z, accumulate, fn);
		}
	});
}

// run_join with cancellation and progress (control.hpp): with a Control and over 2 * kLoopStep flops (as the
// planner counts them: 2 per element pair), the output's outer loops run one prefix combination at a time, each
// about kLoopStep, checking for cancellation in between. The same element order as one call, so the same result.
constexpr double kLoopStep = 2.0e8;

template <class T>
void run_join_steps_impl(Control *ctl, Join join, Agg agg, const Plan &p, const T *x, const T *y, T *z, bool accumulate,
                    const char *fn) {
	double work = 2.0;
	for (const auto *loops : {&p.outer, &p.inner}) {
		for (const Loop &l : *loops) {
			work *= static_cast<double>(l.size);
		}
	}
	if (ctl == nullptr || work <= 2.0 * kLoopStep || p.outer.empty()) {
		if (ctl != nullptr) {
			ctl->announce(work);
		}
		run_join<T>(join, agg, p, x, y, z, accumulate, fn);
		if (ctl != nullptr) {
			ctl->add(work);
		}
		return;
	}
	ctl->announce(work);
	size_t d = 0;
	double per = work;
	while (d < p.outer.size() && per > kLoopStep) {
		per /= static_cast<double>(p.outer[d].size);
		d++;
	}
	Plan sub;
	sub.outer.assign(p.outer.begin() + static_cast<std::ptrdiff_t>(d), p.outer.end());
	sub.inner = p.inner;
	int64_t zn = 1;
	for (const Loop &l : sub.outer) {
		zn *= l.size;
	}
	T *zp = z;
	odometer(p.outer.data(), d, 0, 0, [&](int64_t ox, int64_t oy) {
		ctl->check(fn);
		run_join<T>(join, agg, sub, x + ox, y + oy, zp, accumulate, fn);
		zp += zn;
		ctl->add(per);
	});
}


} // namespace loop_detail

template <class T>
void run_join_steps(Control *ctl, Join join, Agg agg, const Plan &p, const T *x, const T *y, T *z, bool accumulate,
                    const char *fn) {
	loop_detail::run_join_steps_impl<T>(ctl, join, agg, p, x, y, z, accumulate, fn);
}

template <class T>
void run_unary(Agg agg, const Plan &p, const T *x, T *z, const char *fn) {
	loop_detail::run_agg<T, JMul, false>(agg, p, x, x, z, false, fn);
}

} // namespace tsk

// Instantiates the loop for element type T.
#define TSK_LOOP_INSTANCE(T)                                                                                         \
	template void run_join_steps<T>(Control *, Join, Agg, const Plan &, const T *, const T *, T *, bool,             \
	                                const char *);                                                                   \
	template void run_unary<T>(Agg, const Plan &, const T *, T *, const char *);
