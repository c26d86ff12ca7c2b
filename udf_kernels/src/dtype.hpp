// Element types: names, sizes, compile-time dispatch, numpy-like conversions and wrapping integer math.
#pragma once

#include "common.hpp"

#include <cmath>
#include <complex>
#include <type_traits>

namespace tsk {

using c64 = std::complex<float>;
using c128 = std::complex<double>;

// The element types: X(enum, C++ type, name). Order is the order names are listed in errors; the first six are
// the original dtypes, the integer types after them are computed natively too (no wider carrier: uint64 above
// 2**63, max/min/relu/abs and conversions need the real type, not its int64 bits).
#define TSK_DTYPES(X)                                                                                                \
	X(F32, float, "float32")                                                                                         \
	X(F64, double, "float64")                                                                                        \
	X(I32, int32_t, "int32")                                                                                         \
	X(I64, int64_t, "int64")                                                                                         \
	X(C64, c64, "complex64")                                                                                         \
	X(C128, c128, "complex128")                                                                                      \
	X(I8, int8_t, "int8")                                                                                            \
	X(I16, int16_t, "int16")                                                                                         \
	X(U8, uint8_t, "uint8")                                                                                          \
	X(U16, uint16_t, "uint16")                                                                                       \
	X(U32, uint32_t, "uint32")                                                                                       \
	X(U64, uint64_t, "uint64")

#define TSK_DTYPE_ENUM(E, T, NAME) E,
enum class DType { TSK_DTYPES(TSK_DTYPE_ENUM) };
#undef TSK_DTYPE_ENUM

#define TSK_DTYPE_CHOICE(E, T, NAME) ", " NAME
// "float32, float64, ..." (the leading ", " skipped)
constexpr const char *kDTypeChoices = &(TSK_DTYPES(TSK_DTYPE_CHOICE))[2];
#undef TSK_DTYPE_CHOICE

inline const char *dtype_name(DType d) {
	switch (d) {
#define TSK_DTYPE_NAME(E, T, NAME)                                                                                   \
	case DType::E:                                                                                                   \
		return NAME;
		TSK_DTYPES(TSK_DTYPE_NAME)
#undef TSK_DTYPE_NAME
	}
	return "?";
}

inline size_t itemsize(DType d) {
	switch (d) {
#define TSK_DTYPE_SIZE(E, T, NAME)                                                                                   \
	case DType::E:                                                                                                   \
		return sizeof(T);
		TSK_DTYPES(TSK_DTYPE_SIZE)
#undef TSK_DTYPE_SIZE
	}
	return 1;
}

inline bool is_complex_dtype(DType d) {
	return d == DType::C64 || d == DType::C128;
}

inline bool is_integer_dtype(DType d) {
	return !is_complex_dtype(d) && d != DType::F32 && d != DType::F64;
}

inline DType parse_dtype(const Bytes &s, const char *fn, const char *arg = "dtype") {
#define TSK_DTYPE_PARSE(E, T, NAME)                                                                                  \
	if (same_bytes(s, NAME)) {                                                                                       \
		return DType::E;                                                                                             \
	}
	TSK_DTYPES(TSK_DTYPE_PARSE)
#undef TSK_DTYPE_PARSE
	fail(std::string(fn) + ": unknown " + arg + " " + quoted_text(s) + " (valid: " + kDTypeChoices + ")");
}

// A dtype argument parsed once per distinct string.
class DTypeArg {
public:
	DType get(const Bytes &s, const char *fn, const char *arg = "dtype") {
		return cache_.get(s, [&](const Bytes &b) { return parse_dtype(b, fn, arg); });
	}

private:
	Cached<DType> cache_;
};

template <class T>
struct TypeTag {
	using type = T;
};

// Calls f(TypeTag<T>{}) with T the C++ type of d.
template <class F>
decltype(auto) dispatch(DType d, F &&f) {
	switch (d) {
#define TSK_DTYPE_CASE(E, T, NAME)                                                                                   \
	case DType::E:                                                                                                   \
		return f(TypeTag<T> {});
		TSK_DTYPES(TSK_DTYPE_CASE)
#undef TSK_DTYPE_CASE
	}
	return f(TypeTag<double> {});
}

template <class T>
struct is_complex : std::false_type {};
template <class R>
struct is_complex<std::complex<R>> : std::true_type {};
template <class T>
constexpr bool is_complex_v = is_complex<T>::value;

template <class T>
constexpr const char *name_of() {
#define TSK_DTYPE_NAME_OF(E, U, NAME)                                                                                \
	if constexpr (std::is_same_v<T, U>) {                                                                            \
		return NAME;                                                                                                 \
	} else
	TSK_DTYPES(TSK_DTYPE_NAME_OF) {
		return "?";
	}
#undef TSK_DTYPE_NAME_OF
}

template <class T>
inline T load(const unsigned char *p) {
	T v;
	std::memcpy(&v, p, sizeof(T));
	return v;
}

template <class T>
inline void store(unsigned char *p, T v) {
	std::memcpy(p, &v, sizeof(T));
}

// ---- wrapping integer arithmetic (numpy semantics, no signed-overflow UB) ----

// The unsigned type integer arithmetic of T runs in: T's unsigned twin, widened to unsigned int for the 8- and
// 16-bit types (which would otherwise promote to int, where uint16 * uint16 overflows: UB).
template <class T>
using uarith_t = std::common_type_t<std::make_unsigned_t<T>, unsigned>;

template <class T>
inline T wadd(T a, T b) {
	if constexpr (std::is_integral_v<T>) {
		using U = uarith_t<T>;
		return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
	} else {
		return a + b;
	}
}

template <class T>
inline T wsub(T a, T b) {
	if constexpr (std::is_integral_v<T>) {
		using U = uarith_t<T>;
		return static_cast<T>(static_cast<U>(static_cast<U>(a) - static_cast<U>(b)));
	} else {
		return a - b;
	}
}

template <class T>
inline T wmul(T a, T b) {
	if constexpr (std::is_integral_v<T>) {
		using U = uarith_t<T>;
		return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
	} else {
		return a * b;
	}
}

template <class T>
inline T wneg(T a) {
	if constexpr (std::is_integral_v<T>) {
		using U = uarith_t<T>;
		return static_cast<T>(static_cast<U>(U(0) - static_cast<U>(a)));
	} else {
		return -a;
	}
}

// C-style truncating division for integers; x/0 gives 0, MIN/-1 wraps (no trap).
template <class T>
inline T wdiv(T a, T b) {
	if constexpr (std::is_integral_v<T>) {
		if (b == 0) {
			return 0;
		}
		if constexpr (std::is_signed_v<T>) {
			if (b == -1) {
				return wneg(a);
			}
		}
		return static_cast<T>(a / b);
	} else {
		return a / b;
	}
}

// numpy's absolute: |x| in T (abs(MIN) wraps to MIN; unsigned values are their own absolute value).
template <class T>
inline T wabs(T a) {
	if constexpr (std::is_integral_v<T>) {
		if constexpr (std::is_signed_v<T>) {
			return a < 0 ? wneg(a) : a;
		} else {
			return a;
		}
	} else if constexpr (is_complex_v<T>) {
		return T(std::abs(a), 0);
	} else {
		return std::fabs(a);
	}
}

// max(x, 0), NaN-propagating (numpy's maximum(x, 0)); the identity on unsigned types.
template <class T>
inline T relu_of(T v) {
	if constexpr (std::is_unsigned_v<T>) {
		return v;
	} else {
		return v < T(0) ? T(0) : v;
	}
}

// 1 / (1 + e^-v) without overflow for either sign of v (real floating types only).
template <class T>
inline T sigmoid_of(T v) {
	if (v >= T(0)) {
		return T(1) / (T(1) + std::exp(-v));
	}
	const T e = std::exp(v);
	return e / (T(1) + e);
}

// log(1 + e^v) without overflow or loss of precision for either sign of v (real floating types only).
template <class T>
inline T softplus_of(T v) {
	return v > T(0) ? v + std::log1p(std::exp(-v)) : std::log1p(std::exp(v));
}

// NaN-propagating max/min (numpy's np.maximum / np.max semantics).
template <class T>
inline T nan_max(T a, T b) {
	if constexpr (std::is_floating_point_v<T>) {
		if (std::isnan(a)) {
			return a;
		}
		if (std::isnan(b)) {
			return b;
		}
	}
	return b > a ? b : a;
}

template <class T>
inline T nan_min(T a, T b) {
	if constexpr (std::is_floating_point_v<T>) {
		if (std::isnan(a)) {
			return a;
		}
		if (std::isnan(b)) {
			return b;
		}
	}
	return b < a ? b : a;
}

// ---- conversions (numpy astype semantics, with defined out-of-range behaviour) ----

template <class T>
struct real_of {
	using type = T;
};
template <class R>
struct real_of<std::complex<R>> {
	using type = R;
};
template <class T>
using real_of_t = typename real_of<T>::type;

// float -> integer: truncates toward zero; NaN gives 0; values above the type's range clamp to its maximum, values
// below it to its minimum, except that a negative value converted to an unsigned type wraps modulo 2**bits
// through int64 (-1.0 -> 255 for uint8, as numpy's astype on x86-64).
template <class I, class F>
inline I float_to_int(F v) {
	if (std::isnan(v)) {
		return 0;
	}
	const long double x = static_cast<long double>(v);
	// 2^(digits) is exactly representable in every floating type (digits: value bits, 63 for int64, 64 for uint64)
	const long double hi = std::ldexp(1.0L, std::numeric_limits<I>::digits);
	if (x >= hi) {
		return std::numeric_limits<I>::max();
	}
	if constexpr (std::is_unsigned_v<I>) {
		if (x < 0) {
			return static_cast<I>(static_cast<std::make_unsigned_t<int64_t>>(float_to_int<int64_t>(v)));
		}
	} else if (x < -hi) {
		return std::numeric_limits<I>::min();
	}
	return static_cast<I>(v);
}

template <class To, class From>
inline To convert(From v) {
	if constexpr (is_complex_v<From>) {
		if constexpr (is_complex_v<To>) {
			using R = real_of_t<To>;
			return To(static_cast<R>(v.real()), static_cast<R>(v.imag()));
		} else {
			return convert<To>(v.real());
		}
	} else if constexpr (is_complex_v<To>) {
		return To(convert<real_of_t<To>>(v), 0);
	} else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
		return float_to_int<To>(v);
	} else if constexpr (std::is_integral_v<To> && std::is_integral_v<From>) {
		using U = std::make_unsigned_t<To>;
		return static_cast<To>(static_cast<U>(v)); // wraps like numpy astype (int64 <-> uint64: the same bits)
	} else {
		return static_cast<To>(v);
	}
}

} // namespace tsk

namespace tsk {

// Validates that `blob` holds exactly the bytes `shape` of `dt` needs; returns the element count.
inline uint64_t check_operand(const char *fn, const char *arg, const Bytes &blob, const Shape &shape, DType dt) {
	const std::string shape_arg = std::string(arg) + "_shape";
	uint64_t n = checked_numel(shape, itemsize(dt), fn, shape_arg.c_str());
	if (blob.size != n * itemsize(dt)) {
		fail(std::string(fn) + ": operand " + arg + " has " + std::to_string(blob.size) + " bytes but shape " +
		     shape_str(shape) + " of " + dtype_name(dt) + " needs " + std::to_string(n * itemsize(dt)));
	}
	return n;
}

// Validates that a blob's length is a whole number of elements; returns the element count.
inline uint64_t check_whole(const char *fn, const char *arg, const Bytes &blob, DType dt) {
	if (blob.size % itemsize(dt) != 0) {
		fail(std::string(fn) + ": " + arg + " has " + std::to_string(blob.size) + " bytes, not a multiple of the " +
		     std::to_string(itemsize(dt)) + "-byte " + dtype_name(dt) + " item size");
	}
	return blob.size / itemsize(dt);
}

} // namespace tsk
