// Aggregation functors shared by tensor_einsum and the tensor_sum/max/min/prod aggregates:
// identity element and NaN-propagating, integer-wrapping combine step.
#pragma once

#include "dtype.hpp"

namespace tsk {

struct ASum {
	template <class T>
	static T identity() {
		return T(0);
	}
	template <class T>
	static T f(T acc, T v) {
		return wadd(acc, v);
	}
};
struct AProd {
	template <class T>
	static T identity() {
		return T(1);
	}
	template <class T>
	static T f(T acc, T v) {
		return wmul(acc, v);
	}
};
struct AMax {
	template <class T>
	static T identity() {
		if constexpr (std::is_integral_v<T>) {
			return std::numeric_limits<T>::min();
		} else {
			return -std::numeric_limits<T>::infinity();
		}
	}
	template <class T>
	static T f(T acc, T v) {
		return nan_max(acc, v);
	}
};
struct AMin {
	template <class T>
	static T identity() {
		if constexpr (std::is_integral_v<T>) {
			return std::numeric_limits<T>::max();
		} else {
			return std::numeric_limits<T>::infinity();
		}
	}
	template <class T>
	static T f(T acc, T v) {
		return nan_min(acc, v);
	}
};

} // namespace tsk
