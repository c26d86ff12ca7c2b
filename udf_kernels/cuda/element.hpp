// The element-level work of the GPU kernel set, written once for the device and the host.
//
// Every function here is TSK_HD: __host__ __device__ under nvcc (the CUDA kernels of device.cu run them on the
// GPU), plain inline C++ under g++ (the emulated device of emulated.cpp runs the very same functions on the
// host, so the index arithmetic, the operator table and the GEMM packing are tested on machines without a GPU).
//
// The joins, aggregations and maps come from the CPU kernels' operator table (ops.hpp's X-lists, one line per
// operator): this file only supplies device-capable versions of the scalar helpers those lines call, for the
// floating types the GPU path computes (float32, float64).
#pragma once

#include "../src/ops.hpp"
#include "../src/spec.hpp"

#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#define TSK_HD __host__ __device__
#else
#define TSK_HD
#endif

namespace tsk {
namespace gpu {

// ---- the scalar helpers of ops.hpp's lists, for float and double ------------------------------------------

template <class T>
TSK_HD inline T wadd(T a, T b) {
	return a + b;
}
template <class T>
TSK_HD inline T wsub(T a, T b) {
	return a - b;
}
template <class T>
TSK_HD inline T wmul(T a, T b) {
	return a * b;
}
template <class T>
TSK_HD inline T wneg(T a) {
	return -a;
}
template <class T>
TSK_HD inline T wdiv(T a, T b) {
	return a / b;
}
template <class T>
TSK_HD inline T wsquare(T v) {
	return v * v;
}
template <class T>
TSK_HD inline T wabs(T a) {
	return std::fabs(a);
}
template <class T>
TSK_HD inline T truth(bool c) {
	return c ? T(1) : T(0);
}
template <class T>
TSK_HD inline T nan_max(T a, T b) {
	if (a != a) {
		return a;
	}
	if (b != b) {
		return b;
	}
	return b > a ? b : a;
}
template <class T>
TSK_HD inline T nan_min(T a, T b) {
	if (a != a) {
		return a;
	}
	if (b != b) {
		return b;
	}
	return b < a ? b : a;
}
template <class T>
TSK_HD inline T relu_of(T v) {
	return v < T(0) ? T(0) : v;
}
template <class T>
TSK_HD inline T sigmoid_of(T v) {
	if (v >= T(0)) {
		return T(1) / (T(1) + std::exp(-v));
	}
	const T e = std::exp(v);
	return e / (T(1) + e);
}
template <class T>
TSK_HD inline T softplus_of(T v) {
	return v > T(0) ? v + std::log1p(std::exp(-v)) : std::log1p(std::exp(v));
}
template <class T>
TSK_HD inline T lowest_value() {
	return -INFINITY;
}
template <class T>
TSK_HD inline T highest_value() {
	return INFINITY;
}

// A map's param for a floating type (ops.hpp's MapParam carries integer and complex fields the GPU path never
// needs; the names used by the lists are the same).
template <class T>
struct MapParam {
	T real = 0;
};
template <class T>
TSK_HD inline T param_pow(T v, const MapParam<T> &p) {
	return T(std::pow(v, p.real));
}
template <class T>
TSK_HD inline T param_rpow(T v, const MapParam<T> &p) {
	return T(std::pow(p.real, v));
}
template <class T>
TSK_HD inline T param_scale(T v, const MapParam<T> &p) {
	return v * p.real;
}

// ---- complex numbers --------------------------------------------------------------------------------------

// A complex number laid out as std::complex<R> (and cuBLAS's cuComplex / cuDoubleComplex): real, imaginary.
// Only what multiply/sum contractions need: the GPU computes complex blocks in those alone.
template <class R>
struct Complex {
	R re, im;
	TSK_HD Complex(R r = R(0), R i = R(0)) : re(r), im(i) {
	}
};
template <class R>
TSK_HD inline Complex<R> operator+(Complex<R> a, Complex<R> b) {
	return Complex<R>(a.re + b.re, a.im + b.im);
}
template <class R>
TSK_HD inline Complex<R> operator*(Complex<R> a, Complex<R> b) {
	return Complex<R>(a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re);
}
template <class T>
struct is_gpu_complex : std::false_type {};
template <class R>
struct is_gpu_complex<Complex<R>> : std::true_type {};

// ---- the functors, generated from ops.hpp's lists -----------------------------------------------------------

#define TSK_GPU_JOIN(E, NAME, COMPLEX, ...)                                                                          \
	struct J##E {                                                                                                    \
		template <class T>                                                                                           \
		TSK_HD static T f(T a, T b) {                                                                                \
			return __VA_ARGS__;                                                                                      \
		}                                                                                                            \
	};
TSK_JOINS(TSK_GPU_JOIN)
#undef TSK_GPU_JOIN

#define TSK_GPU_AGG(E, NAME, COMPLEX, EMPTY, IDENTITY, ...)                                                          \
	struct A##E {                                                                                                    \
		template <class T>                                                                                           \
		TSK_HD static T identity() {                                                                                 \
			return IDENTITY;                                                                                         \
		}                                                                                                            \
		template <class T>                                                                                           \
		TSK_HD static T f(T acc, T v) {                                                                              \
			return __VA_ARGS__;                                                                                      \
		}                                                                                                            \
	};
TSK_AGGS(TSK_GPU_AGG)
#undef TSK_GPU_AGG

// A unary "join": the loop reads x alone (tensor_einsum1, and the packing of GEMM operands).
struct JFirst {
	template <class T>
	TSK_HD static T f(T a, T) {
		return a;
	}
};

#define TSK_GPU_MAP(E, NAME, FLAGS, ...)                                                                             \
	struct M##E {                                                                                                    \
		template <class T>                                                                                           \
		TSK_HD static T f(T v, [[maybe_unused]] const MapParam<T> &p) {                                              \
			return __VA_ARGS__;                                                                                      \
		}                                                                                                            \
	};
TSK_MAPS(TSK_GPU_MAP)
#undef TSK_GPU_MAP

// ---- dispatch to the functors (host side: picks the kernel instantiation) ---------------------------------

template <class F>
void with_gpu_agg(Agg agg, F &&f) {
	switch (agg) {
#define TSK_GPU_AGG_CASE(E, ...)                                                                                     \
	case Agg::E:                                                                                                     \
		f(A##E {});                                                                                                  \
		return;
		TSK_AGGS(TSK_GPU_AGG_CASE)
#undef TSK_GPU_AGG_CASE
	}
}

// f(join functor, agg functor); a unary loop reads x alone (JFirst).
template <class F>
void with_join_agg(Join join, Agg agg, bool unary, F &&f) {
	if (unary) {
		with_gpu_agg(agg, [&](auto a) { f(JFirst {}, a); });
		return;
	}
	switch (join) {
#define TSK_GPU_JOIN_CASE(E, ...)                                                                                    \
	case Join::E:                                                                                                    \
		with_gpu_agg(agg, [&](auto a) { f(J##E {}, a); });                                                           \
		return;
		TSK_JOINS(TSK_GPU_JOIN_CASE)
#undef TSK_GPU_JOIN_CASE
	}
}

// f(T{}) for a real dtype the device computes (device_dtype: float32, float64), as float or double.
template <class F>
void with_real_type(DType dt, F &&f) {
	if (dt == DType::F32) {
		f(float {});
	} else if (dt == DType::F64) {
		f(double {});
	} else {
		fail(std::string("the GPU kernels map float32 and float64 blocks only, not ") + dtype_name(dt));
	}
}

// f(T{}) for the element type of dt: float, double, or a Complex for the complex dtypes.
template <class F>
void with_loop_type(DType dt, F &&f) {
	switch (dt) {
	case DType::F32:
		f(float {});
		return;
	case DType::F64:
		f(double {});
		return;
	case DType::C64:
		f(Complex<float> {});
		return;
	case DType::C128:
		f(Complex<double> {});
		return;
	default:
		fail(std::string("the GPU kernels do not compute dtype ") + dtype_name(dt));
	}
}

// with_join_agg for element type T: complex loops are the multiply/sum ones (and unary sums) only.
template <class T, class F>
void with_join_agg_of(Join join, Agg agg, bool unary, F &&f) {
	if constexpr (is_gpu_complex<T>::value) {
		if (agg != Agg::Sum || (!unary && join != Join::Mul)) {
			fail("the GPU kernels compute complex blocks in multiply/sum contractions only");
		}
		if (unary) {
			f(JFirst {}, ASum {});
		} else {
			f(JMul {}, ASum {});
		}
	} else {
		with_join_agg(join, agg, unary, std::forward<F>(f));
	}
}

template <class F>
void with_gpu_map(Fn fn, F &&f) {
	switch (fn) {
#define TSK_GPU_MAP_CASE(E, ...)                                                                                     \
	case Fn::E:                                                                                                      \
		f(M##E {});                                                                                                  \
		return;
		TSK_MAPS(TSK_GPU_MAP_CASE)
#undef TSK_GPU_MAP_CASE
	}
}

// ---- the generic loop ------------------------------------------------------------------------------------

// z[o] = agg over the inner loops of join(x[..], y[..]) for every output index o: loops[0, n_outer) are the
// output's labels in its C order, loops[n_outer, n_outer + n_inner) the summed ones (ops.hpp's Loop: a label's
// size and element strides in x and y; a repeated label's strides add up, which walks the diagonal). Passed to
// a kernel by value: a label appears once, so 52 loops at most.
struct LoopJob {
	int n_outer = 0;
	int n_inner = 0;
	uint64_t out_numel = 0;
	uint64_t inner_numel = 0;
	Loop loops[kNumLabels];
};

// The offsets in x and y of index `i` of the loops [first, first + n) (C order: the last loop is fastest).
TSK_HD inline void offsets_of(const LoopJob &j, int first, int n, uint64_t i, int64_t &ox, int64_t &oy) {
	for (int k = first + n - 1; k >= first; --k) {
		const uint64_t s = static_cast<uint64_t>(j.loops[k].size);
		const int64_t q = static_cast<int64_t>(i % s);
		i /= s;
		ox += q * j.loops[k].sx;
		oy += q * j.loops[k].sy;
	}
}

// A sum of many terms in three levels: runs of 256 terms, runs of 256 of those, and the rest. Its rounding error
// grows with ~512 + n / 65536 terms instead of n: one running total of 2e7 float32 ones stops at 2**24, and
// 1e7 float64 tenths were 7e5 eps off (the CPU kernels sum pairwise, numpy too).
template <class T>
struct CascadeSum {
	T low = T(0), mid = T(0), high = T(0);
	unsigned n_low = 0, n_mid = 0;
	TSK_HD void add(T v) {
		low = low + v;
		if (++n_low == 256) {
			mid = mid + low;
			low = T(0);
			n_low = 0;
			if (++n_mid == 256) {
				high = high + mid;
				mid = T(0);
				n_mid = 0;
			}
		}
	}
	TSK_HD T result() const {
		return high + (mid + low);
	}
};

// acc ⊕ each term, for aggregation A: a sum in CascadeSum's levels, any other one term at a time (max, min and
// prod have no error to grow, or none a cascade would bound).
template <class T, class A>
struct Accumulator {
	T acc = A::template identity<T>();
	TSK_HD void add(T v) {
		acc = A::template f<T>(acc, v);
	}
	TSK_HD T result() const {
		return acc;
	}
};
template <class T>
struct Accumulator<T, ASum> : CascadeSum<T> {};

// Output element o of the loop job: its terms in C order of the summed labels. The last summed label is walked
// by stride; only the others are decoded by division, once per run of it. With nothing summed it is the join
// itself: agg(identity, v) would make a -0.0 product +0.0 (0 + -0.0), where numpy keeps its sign.
template <class T, class J, class A>
TSK_HD inline T loop_element(const LoopJob &j, const T *x, const T *y, uint64_t o) {
	int64_t bx = 0, by = 0;
	offsets_of(j, 0, j.n_outer, o, bx, by);
	if (j.n_inner == 0) {
		return J::template f<T>(x[bx], y == nullptr ? T(0) : y[by]);
	}
	Accumulator<T, A> acc;
	const Loop &last = j.loops[j.n_outer + j.n_inner - 1];
	const uint64_t run = static_cast<uint64_t>(last.size);
	const uint64_t runs = run == 0 ? 0 : j.inner_numel / run;
	for (uint64_t t = 0; t < runs; ++t) {
		int64_t ox = bx, oy = by;
		offsets_of(j, j.n_outer, j.n_inner - 1, t, ox, oy);
		for (uint64_t u = 0; u < run; ++u, ox += last.sx, oy += last.sy) {
			acc.add(J::template f<T>(x[ox], y == nullptr ? T(0) : y[oy]));
		}
	}
	return acc.result();
}

} // namespace gpu
} // namespace tsk
