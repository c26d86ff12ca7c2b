// Element types: names, sizes, compile-time dispatch, numpy-like conversions and wrapping integer math.
#pragma once

#include "common.hpp"

#include <cmath>
#include <complex>
#include <type_traits>

namespace tsk {

enum class DType { F32, F64, I32, I64, C64, C128 };

using c64 = std::complex<float>;
using c128 = std::complex<double>;

constexpr const char *kDTypeChoices = "float32, float64, int32, int64, complex64, complex128";

inline const char *dtype_name(DType d) {
	switch (d) {
	case DType::F32:
		return "float32";
	case DType::F64:
		return "float64";
	case DType::I32:
		return "int32";
	case DType::I64:
		return "int64";
	case DType::C64:
		return "complex64";
	case DType::C128:
		return "complex128";
	}
	return "?";
}

inline size_t itemsize(DType d) {
	switch (d) {
	case DType::F32:
	case DType::I32:
		return 4;
	case DType::F64:
	case DType::I64:
	case DType::C64:
		return 8;
	case DType::C128:
		return 16;
	}
	return 1;
}

inline bool is_complex_dtype(DType d) {
	return d == DType::C64 || d == DType::C128;
}

inline DType parse_dtype(const Bytes &s, const char *fn, const char *arg = "dtype") {
	static constexpr DType all[] = {DType::F32, DType::F64, DType::I32, DType::I64, DType::C64, DType::C128};
	for (DType d : all) {
		if (same_bytes(s, dtype_name(d))) {
			return d;
		}
	}
	fail(std::string(fn) + ": unknown " + arg + " '" + s.str() + "' (valid: " + kDTypeChoices + ")");
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
	case DType::F32:
		return f(TypeTag<float> {});
	case DType::F64:
		return f(TypeTag<double> {});
	case DType::I32:
		return f(TypeTag<int32_t> {});
	case DType::I64:
		return f(TypeTag<int64_t> {});
	case DType::C64:
		return f(TypeTag<c64> {});
	case DType::C128:
		return f(TypeTag<c128> {});
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
	if constexpr (std::is_same_v<T, float>) {
		return "float32";
	} else if constexpr (std::is_same_v<T, double>) {
		return "float64";
	} else if constexpr (std::is_same_v<T, int32_t>) {
		return "int32";
	} else if constexpr (std::is_same_v<T, int64_t>) {
		return "int64";
	} else if constexpr (std::is_same_v<T, c64>) {
		return "complex64";
	} else {
		return "complex128";
	}
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

template <class T>
inline T wadd(T a, T b) {
	if constexpr (std::is_integral_v<T>) {
		using U = std::make_unsigned_t<T>;
		return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
	} else {
		return a + b;
	}
}

template <class T>
inline T wsub(T a, T b) {
	if constexpr (std::is_integral_v<T>) {
		using U = std::make_unsigned_t<T>;
		return static_cast<T>(static_cast<U>(static_cast<U>(a) - static_cast<U>(b)));
	} else {
		return a - b;
	}
}

template <class T>
inline T wmul(T a, T b) {
	if constexpr (std::is_integral_v<T>) {
		using U = std::make_unsigned_t<T>;
		return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
	} else {
		return a * b;
	}
}

template <class T>
inline T wneg(T a) {
	if constexpr (std::is_integral_v<T>) {
		using U = std::make_unsigned_t<T>;
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
		if (b == -1) {
			return wneg(a);
		}
		return static_cast<T>(a / b);
	} else {
		return a / b;
	}
}

template <class T>
inline T wabs(T a) {
	if constexpr (std::is_integral_v<T>) {
		return a < 0 ? wneg(a) : a;
	} else if constexpr (is_complex_v<T>) {
		return T(std::abs(a), 0);
	} else {
		return std::fabs(a);
	}
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

// float -> integer: truncates toward zero; NaN gives 0; out-of-range values clamp to the type's limits.
template <class I, class F>
inline I float_to_int(F v) {
	if (std::isnan(v)) {
		return 0;
	}
	// 2^(digits) is exactly representable in every floating type.
	const long double hi = std::ldexp(1.0L, std::numeric_limits<I>::digits);
	const long double x = static_cast<long double>(v);
	if (x >= hi) {
		return std::numeric_limits<I>::max();
	}
	if (x < -hi) {
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
		return static_cast<To>(static_cast<U>(v)); // wraps like numpy astype
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
