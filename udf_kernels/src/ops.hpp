// The operator table of the kernels: every join (tensor_einsum's ⊗), aggregation (⊕: tensor_einsum's agg and the
// tensor_sum/max/min/prod aggregates) and element-wise map (tensor_map), each defined once, on one line.
//
// Everything else is generated from these lists: the enums, the functors, the names, name parsing (with the
// list of valid names in its error), the complex/integer checks and the dispatch switches. Adding an operator
// is one line here (and one row of tensorsql's operator table, tensorsql/ir/ops.py, which
// tests/kernels/test_ops_table.py checks against the kernels). Order is the order names are listed in errors.
//
// Integer arithmetic wraps (numpy semantics, no signed-overflow UB), max/min propagate NaN.
#pragma once

#include "dtype.hpp"

#include <cmath>
#include <cstddef>
#include <string>

namespace tsk {

// ---- the lists -------------------------------------------------------------------------------------------

// Joins z = a ⊗ b: X(Enum, "name", defined for complex, expression of a and b (type T)).
#define TSK_JOINS(X)                                                                                                 \
	X(Mul, "multiply", true, wmul(a, b))                                                                             \
	X(Add, "add", true, wadd(a, b))                                                                                  \
	X(Sub, "subtract", true, wsub(a, b))                                                                             \
	X(Div, "divide", true, wdiv(a, b))                                                                               \
	X(SqDiff, "sqdiff", true, wsquare(wsub(a, b)))                                                                   \
	X(AbsDiff, "absdiff", false, wabs(wsub(a, b)))                                                                   \
	X(Max, "max", false, nan_max(a, b))                                                                              \
	X(Min, "min", false, nan_min(a, b))                                                                              \
	X(Greater, "greater", false, truth<T>(a > b))                                                                    \
	X(GreaterEqual, "greater_equal", false, truth<T>(a >= b))                                                        \
	X(Less, "less", false, truth<T>(a < b))                                                                          \
	X(LessEqual, "less_equal", false, truth<T>(a <= b))                                                              \
	X(Equal, "equal", false, truth<T>(a == b))                                                                       \
	X(NotEqual, "not_equal", false, truth<T>(a != b))

// Aggregations acc ⊕ v: X(Enum, "name", defined for complex, numpy's name when it has no identity over an empty
// label (nullptr: it has one), identity (type T: the accumulator's start), expression of acc and v).
#define TSK_AGGS(X)                                                                                                  \
	X(Sum, "sum", true, nullptr, T(0), wadd(acc, v))                                                                 \
	X(Max, "max", false, "maximum", lowest_value<T>(), nan_max(acc, v))                                              \
	X(Min, "min", false, "minimum", highest_value<T>(), nan_min(acc, v))                                             \
	X(Prod, "prod", true, nullptr, T(1), wmul(acc, v))

// Maps z = f(v): X(Enum, "name", flags (kMapComplex: defined for complex; kMapInteger: for int32/int64;
// kMapParam: takes the param; kMapIntExponent: on integers the param must be an integer >= 0), expression of v
// (type T) and p (MapParam<T>, the param prepared once per call)).
#define TSK_MAPS(X)                                                                                                  \
	X(Exp, "exp", kMapComplex, T(std::exp(v)))                                                                       \
	X(Log, "log", kMapComplex, T(std::log(v)))                                                                       \
	X(Sqrt, "sqrt", kMapComplex, T(std::sqrt(v)))                                                                    \
	X(Relu, "relu", kMapInteger, relu_of(v))                                                                         \
	X(Neg, "neg", kMapComplex | kMapInteger, wneg(v))                                                                \
	X(Abs, "abs", kMapComplex | kMapInteger, wabs(v))                                                                \
	X(Pow, "pow", kMapComplex | kMapInteger | kMapParam | kMapIntExponent, param_pow(v, p))                          \
	X(Scale, "scale", kMapComplex | kMapInteger | kMapParam, param_scale(v, p))                                      \
	X(Square, "square", kMapComplex | kMapInteger, wsquare(v))                                                       \
	X(Reciprocal, "reciprocal", kMapComplex, T(1) / v)                                                              \
	X(Sigmoid, "sigmoid", 0, sigmoid_of(v))                                                                          \
	X(Tanh, "tanh", kMapComplex, T(std::tanh(v)))                                                                    \
	X(Softplus, "softplus", 0, softplus_of(v))                                                                       \
	X(RPow, "rpow", kMapParam, param_rpow(v, p))

// ---- scalar helpers the lists use ------------------------------------------------------------------------

// A comparison's result in the operands' dtype: 1 or 0 (tensors have no bool dtype; NaN compares as IEEE says).
template <class T>
inline T truth(bool c) {
	return c ? T(1) : T(0);
}

template <class T>
inline T wsquare(T v) {
	return wmul(v, v);
}

// max's identity: -inf, or the integer type's minimum.
template <class T>
inline T lowest_value() {
	if constexpr (std::is_integral_v<T>) {
		return std::numeric_limits<T>::min();
	} else {
		return -std::numeric_limits<T>::infinity();
	}
}

// min's identity: +inf, or the integer type's maximum.
template <class T>
inline T highest_value() {
	if constexpr (std::is_integral_v<T>) {
		return std::numeric_limits<T>::max();
	} else {
		return std::numeric_limits<T>::infinity();
	}
}

enum MapFlags : unsigned { kMapComplex = 1u, kMapInteger = 2u, kMapParam = 4u, kMapIntExponent = 8u };

// A map's param, prepared once per call for element type T.
template <class T>
struct MapParam {
	real_of_t<T> real = 0;  // as the real type (float/complex pow and scale)
	T value = T(0);         // converted to T (integer scale; numpy astype semantics)
	uint64_t exponent = 0;  // the validated integer exponent (integer pow)
	int small_power = 0;    // complex pow: an integer exponent of magnitude <= kSmallPower, taken by squaring
	bool by_squaring = false;
};

// numpy raises a complex number to an integer power of magnitude at most 100 by repeated squaring (exact-ish),
// not through exp(p log z), whose error grows with |p log|z||.
constexpr int kSmallPower = 100;

// Integer power by squaring with wrapping arithmetic.
template <class T>
[[gnu::always_inline]] inline T ipow(T base, uint64_t e) {
	T r = 1;
	while (e) {
		if (e & 1) {
			r = wmul(r, base);
		}
		base = wmul(base, base);
		e >>= 1;
	}
	return r;
}

template <class T>
[[gnu::always_inline]] inline T param_pow(T v, const MapParam<T> &p) {
	if constexpr (std::is_integral_v<T>) {
		return ipow(v, p.exponent);
	} else if constexpr (is_complex_v<T>) {
		if (p.by_squaring) {
			T r(1), base = v;
			for (unsigned e = static_cast<unsigned>(p.small_power < 0 ? -p.small_power : p.small_power); e != 0;
			     e >>= 1) {
				if (e & 1u) {
					r = r * base;
				}
				base = base * base;
			}
			return p.small_power < 0 ? T(1) / r : r;
		}
		return T(std::pow(v, p.real));
	} else {
		return T(std::pow(v, p.real));
	}
}

// param ** v (a number to the power of a real tensor): libm's pow, as numpy's (exp(v * log param) loses
// ~|v log param| ulps and gives nan for 1 ** inf).
template <class T>
[[gnu::always_inline]] inline T param_rpow(T v, const MapParam<T> &p) {
	if constexpr (std::is_integral_v<T> || is_complex_v<T>) {
		return v; // never called: the map's flags refuse integer and complex input first
	} else {
		return T(std::pow(p.real, v));
	}
}

template <class T>
[[gnu::always_inline]] inline T param_scale(T v, const MapParam<T> &p) {
	if constexpr (std::is_integral_v<T>) {
		return wmul(v, p.value);
	} else {
		return v * p.real; // complex times real: no 0 * inf from a zero imaginary part
	}
}

// ---- generated: enums, functors, names -------------------------------------------------------------------

#define TSK_ENUM_ENTRY(E, ...) E,
#define TSK_NAME_ENTRY(E, NAME, ...) NAME,

enum class Join { TSK_JOINS(TSK_ENUM_ENTRY) };
enum class Agg { TSK_AGGS(TSK_ENUM_ENTRY) };
enum class Fn { TSK_MAPS(TSK_ENUM_ENTRY) };

constexpr const char *kJoinNames[] = {TSK_JOINS(TSK_NAME_ENTRY)};
constexpr const char *kAggNames[] = {TSK_AGGS(TSK_NAME_ENTRY)};
constexpr const char *kFnNames[] = {TSK_MAPS(TSK_NAME_ENTRY)};

#undef TSK_ENUM_ENTRY
#undef TSK_NAME_ENTRY

// J<Enum>: z = f(a, b).
#define TSK_JOIN_FUNCTOR(E, NAME, COMPLEX, ...)                                                                      \
	struct J##E {                                                                                                    \
		static constexpr const char *kName = NAME;                                                                   \
		static constexpr bool kComplex = COMPLEX;                                                                    \
		template <class T>                                                                                           \
		static T f(T a, T b) {                                                                                       \
			return __VA_ARGS__;                                                                                      \
		}                                                                                                            \
	};
TSK_JOINS(TSK_JOIN_FUNCTOR)
#undef TSK_JOIN_FUNCTOR

// A<Enum>: identity<T>() and acc = f(acc, v); kSql names its block aggregate (tensor_sum, ...).
#define TSK_AGG_FUNCTOR(E, NAME, COMPLEX, EMPTY, IDENTITY, ...)                                                      \
	struct A##E {                                                                                                    \
		static constexpr const char *kName = NAME;                                                                   \
		static constexpr const char *kSql = "tensor_" NAME;                                                          \
		static constexpr bool kComplex = COMPLEX;                                                                    \
		template <class T>                                                                                           \
		static T identity() {                                                                                        \
			return IDENTITY;                                                                                         \
		}                                                                                                            \
		template <class T>                                                                                           \
		static T f(T acc, T v) {                                                                                     \
			return __VA_ARGS__;                                                                                      \
		}                                                                                                            \
	};
TSK_AGGS(TSK_AGG_FUNCTOR)
#undef TSK_AGG_FUNCTOR

// M<Enum>: z = f(v, p).
#define TSK_MAP_FUNCTOR(E, NAME, FLAGS, ...)                                                                         \
	struct M##E {                                                                                                    \
		static constexpr const char *kName = NAME;                                                                   \
		static constexpr unsigned kFlags = FLAGS;                                                                    \
		static constexpr const char *kParamName = ((FLAGS) & kMapIntExponent) != 0 ? "exponent" : "factor";         \
		template <class T>                                                                                           \
		static T f(T v, [[maybe_unused]] const MapParam<T> &p) {                                                     \
			return __VA_ARGS__;                                                                                      \
		}                                                                                                            \
	};
TSK_MAPS(TSK_MAP_FUNCTOR)
#undef TSK_MAP_FUNCTOR

// ---- generated: names, parsing, properties -----------------------------------------------------------------

template <size_t N>
std::string name_list(const char *const (&names)[N]) {
	std::string r;
	for (size_t i = 0; i < N; i++) {
		r += (i ? ", " : "");
		r += names[i];
	}
	return r;
}

// The enum value whose name is s; fails as "<fn>: unknown <what> '<s>' (valid: <names>)".
template <class E, size_t N>
E parse_named(const Bytes &s, const char *const (&names)[N], const char *fn, const char *what) {
	for (size_t i = 0; i < N; i++) {
		if (same_bytes(s, names[i])) {
			return static_cast<E>(i);
		}
	}
	fail(std::string(fn) + ": unknown " + what + " " + quoted_text(s) + " (valid: " + name_list(names) + ")");
}

inline Join parse_join(const Bytes &s, const char *fn) {
	return parse_named<Join>(s, kJoinNames, fn, "join");
}
inline Agg parse_agg(const Bytes &s, const char *fn) {
	return parse_named<Agg>(s, kAggNames, fn, "agg");
}
inline Fn parse_fn(const Bytes &s, const char *fn) {
	return parse_named<Fn>(s, kFnNames, fn, "fn");
}

inline const char *join_name(Join j) {
	return kJoinNames[static_cast<size_t>(j)];
}
inline const char *agg_name(Agg a) {
	return kAggNames[static_cast<size_t>(a)];
}
inline const char *fn_name(Fn f) {
	return kFnNames[static_cast<size_t>(f)];
}

// numpy's name of aggregation a when a reduction over an empty label has no result ("zero-size array to
// reduction operation maximum which has no identity"), nullptr when its identity is the result (sum: 0, prod: 1).
inline const char *agg_without_identity(Agg a) {
	switch (a) {
#define TSK_AGG_EMPTY(E, NAME, COMPLEX, EMPTY, ...)                                                                  \
	case Agg::E:                                                                                                     \
		return EMPTY;
		TSK_AGGS(TSK_AGG_EMPTY)
#undef TSK_AGG_EMPTY
	}
	return nullptr;
}

inline bool agg_complex(Agg a) {
	switch (a) {
#define TSK_AGG_COMPLEX(E, NAME, COMPLEX, ...)                                                                       \
	case Agg::E:                                                                                                     \
		return COMPLEX;
		TSK_AGGS(TSK_AGG_COMPLEX)
#undef TSK_AGG_COMPLEX
	}
	return false;
}

// ---- generated: dispatch -----------------------------------------------------------------------------------

// f(J{}) with J the functor of join j.
template <class F>
decltype(auto) with_join(Join j, F &&f) {
	switch (j) {
#define TSK_JOIN_CASE(E, ...)                                                                                        \
	case Join::E:                                                                                                    \
		return f(J##E {});
		TSK_JOINS(TSK_JOIN_CASE)
#undef TSK_JOIN_CASE
	}
	return f(JMul {});
}

// f(A{}) with A the functor of aggregation a.
template <class F>
decltype(auto) with_agg(Agg a, F &&f) {
	switch (a) {
#define TSK_AGG_CASE(E, ...)                                                                                         \
	case Agg::E:                                                                                                     \
		return f(A##E {});
		TSK_AGGS(TSK_AGG_CASE)
#undef TSK_AGG_CASE
	}
	return f(ASum {});
}

// f(M{}) with M the functor of map fn.
template <class F>
decltype(auto) with_map(Fn fn, F &&f) {
	switch (fn) {
#define TSK_MAP_CASE(E, ...)                                                                                         \
	case Fn::E:                                                                                                      \
		return f(M##E {});
		TSK_MAPS(TSK_MAP_CASE)
#undef TSK_MAP_CASE
	}
	return f(MExp {});
}

// f(A{}) for every aggregation, in table order; true when every call returned true (stops at the first false).
template <class F>
bool all_aggs(F &&f) {
#define TSK_AGG_ALL(E, ...) &&f(A##E {})
	return true TSK_AGGS(TSK_AGG_ALL);
#undef TSK_AGG_ALL
}

} // namespace tsk
