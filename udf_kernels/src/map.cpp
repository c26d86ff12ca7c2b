// tensor_map (elementwise functions) and tensor_cast (numpy astype between the six dtypes).
#include "dtype.hpp"
#include "functions.hpp"
#include "gemm.hpp"
#include "ops.hpp"
#include "rows.hpp"
#include "values.hpp"

#include <cstdio>
#include <cstdlib>

namespace tsk {
namespace {

// A double for a message: an integer value as an integer ("300"), anything else in the shortest form that reads
// back the same ("nan", "inf", "0.5").
std::string number_str(double v) {
	if (v == std::floor(v) && std::fabs(v) < 1e18) {
		return std::to_string(static_cast<int64_t>(v));
	}
	char buf[32];
	std::snprintf(buf, sizeof buf, "%.17g", v);
	for (int prec = 1; prec < 17; prec++) {
		char shorter[32];
		std::snprintf(shorter, sizeof shorter, "%.*g", prec, v);
		if (std::strtod(shorter, nullptr) == v) {
			return shorter;
		}
	}
	return buf;
}

// param is an integer that T holds exactly.
template <class T>
bool integer_in_range(double param) {
	const double hi = std::ldexp(1.0, std::numeric_limits<T>::digits); // 2**63 for int64, 2**64 for uint64
	const double lo = std::is_signed_v<T> ? -hi : 0.0;
	return param == std::floor(param) && param >= lo && param < hi; // false for nan and +-inf
}

// out[i] = op(in[i]) for i in [i0, i1): the pointers are parameters, not captured, so the loop vectorizes
template <class T, class Op>
void apply_range(const unsigned char *in, unsigned char *out, uint64_t i0, uint64_t i1, Op op) {
	for (uint64_t i = i0; i < i1; i++) {
		store<T>(out + i * sizeof(T), op(load<T>(in + i * sizeof(T))));
	}
}

// out[i] = op(in[i]) for i < n, split over the database's threads when big (gemm.hpp: loop_threads_wanted).
template <class T, class Op>
void apply_all(ThreadBudget *budget, const unsigned char *in, unsigned char *out, uint64_t n, Op op) {
	const auto run = [in, out, op](int64_t i0, int64_t i1) {
		apply_range<T>(in, out, static_cast<uint64_t>(i0), static_cast<uint64_t>(i1), op);
	};
	const int want = budget != nullptr ? loop_threads_wanted(static_cast<double>(n), budget->total()) : 1;
	if (want <= 1) {
		run(0, static_cast<int64_t>(n));
		return;
	}
	const int got = budget->acquire(want);
	Lease lease {budget, got};
	parallel_chunks(budget, got, static_cast<int64_t>(n), run);
}

// out = map f of in (n elements of T), after the checks of the map's flags (ops.hpp).
template <class T>
void map_kernel(ThreadBudget *budget, Fn f, const unsigned char *in, unsigned char *out, uint64_t n, bool has_param,
                double param, const char *FN) {
	with_map(f, [&](auto tag) {
		using M = decltype(tag);
		const std::string where = std::string(FN) + ": fn '" + M::kName + "' ";
		if ((M::kFlags & kMapParam) != 0 && !has_param) {
			fail(where + "needs a param (call tensor_map(fn, dtype, x, param))");
		}
		if constexpr (std::is_integral_v<T> && (M::kFlags & kMapInteger) == 0) {
			fail(where + "is not defined for " + name_of<T>() + "; promote to a float dtype first");
		} else if constexpr (is_complex_v<T> && (M::kFlags & kMapComplex) == 0) {
			fail(where + "is not defined for complex (dtype " + name_of<T>() + ")");
		} else {
			MapParam<T> p;
			if constexpr (std::is_integral_v<T>) {
				if constexpr ((M::kFlags & kMapIntExponent) != 0) {
					if (!(param >= 0) || param != std::floor(param) || param > 1e18) {
						fail(where + "on " + name_of<T>() + " needs an integer exponent >= 0, got " + number_str(param) +
						     "; promote to a float dtype first");
					}
					p.exponent = static_cast<uint64_t>(param);
				} else if constexpr ((M::kFlags & kMapParam) != 0) {
					// an integer result needs an integer param the dtype holds (numpy 2: OverflowError for
					// int8 * 300); anything else (0.5, nan, inf) has a float result: promote first
					if (!integer_in_range<T>(param)) {
						fail(where + "on " + name_of<T>() + " needs an integer " + M::kParamName + " in [" +
						     std::to_string(std::numeric_limits<T>::min()) + ", " +
						     std::to_string(std::numeric_limits<T>::max()) + "], got " + number_str(param) +
						     "; promote to a float dtype first");
					}
					p.value = static_cast<T>(param);
				}
			} else {
				p.real = static_cast<real_of_t<T>>(param);
				if constexpr (is_complex_v<T> && (M::kFlags & kMapIntExponent) != 0) {
					p.by_squaring = param == std::floor(param) && std::fabs(param) <= kSmallPower;
					p.small_power = p.by_squaring ? static_cast<int>(param) : 0;
				}
			}
			apply_all<T>(budget, in, out, n, [p](T v) { return M::template f<T>(v, p); });
		}
	});
}

void map_impl(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output, bool with_param) {
	static constexpr const char *FN = "tensor_map";
	guard_scalar(info, FN, [&] {
		Col fn_c(input, 0);
		DTypeCol dtype_c(input, 1);
		BlobCol x(input, 2);
		Col param_c = with_param ? Col(input, 3) : Col(input, 2);
		Cached<Fn> fns;
		ThreadBudget *budget = budget_of(duckdb_scalar_function_get_extra_info(info));
		MemoryBudget *mem = memory_of(budget);
		AlignedBuf zb(mem, FN, "the output block");
		CallCharge charged(mem, FN);
		const auto args_valid = all_valid(fn_c, dtype_c, x);
		auto valid = [&](idx_t row) { return args_valid(row) && (!with_param || param_c.valid(row)); };
		scalar_rows(input, output, valid, [&](idx_t row) {
			const Fn f = fns.get(fn_c.str(row), [](const Bytes &b) { return parse_fn(b, FN); });
			const DType dt = dtype_c.get(row, FN);
			const uint64_t n = x.read(row, dt, FN);
			const double param = with_param ? param_c.f64(row) : 0.0;
			unsigned char *z = zb.resize(x.bytes.size);
			dispatch(dt, [&](auto tag) {
				using T = typename decltype(tag)::type;
				map_kernel<T>(budget, f, x.bytes.udata(), z, n, with_param, param, FN);
			});
			charged.add(x.bytes.size, "the result blobs of a chunk");
			set_blob(output, row, z, x.bytes.size);
		});
	});
}

} // namespace

void map_values(ThreadBudget *budget, DType dt, Fn f, const unsigned char *in, unsigned char *out, uint64_t n,
                bool has_param, double param, const char *fn) {
	dispatch(dt, [&](auto tag) {
		using T = typename decltype(tag)::type;
		map_kernel<T>(budget, f, in, out, n, has_param, param, fn);
	});
}

void cast_values(DType from, DType to, const unsigned char *in, unsigned char *out, uint64_t n) {
	dispatch(from, [&](auto ftag) {
		using F = typename decltype(ftag)::type;
		dispatch(to, [&](auto ttag) {
			using T = typename decltype(ttag)::type;
			for (uint64_t i = 0; i < n; i++) {
				store<T>(out + i * sizeof(T), convert<T>(load<F>(in + i * sizeof(F))));
			}
		});
	});
}

void tensor_map(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	map_impl(info, input, output, false);
}

void tensor_map_param(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	map_impl(info, input, output, true);
}

void tensor_cast(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensor_cast";
	guard_scalar(info, FN, [&] {
		BlobCol x(input, 0);
		DTypeCol from_c(input, 1), to_c(input, 2);
		MemoryBudget *mem = memory_of_info(duckdb_scalar_function_get_extra_info(info));
		AlignedBuf zb(mem, FN, "the output block");
		CallCharge charged(mem, FN);
		scalar_rows(input, output, all_valid(x, from_c, to_c), [&](idx_t row) {
			const DType from = from_c.get(row, FN, "from_dtype");
			const DType to = to_c.get(row, FN, "to_dtype");
			const uint64_t n = x.read(row, from, FN);
			const size_t out_bytes = n * itemsize(to);
			if (out_bytes > kMaxBlobBytes) {
				fail(std::string(FN) + ": result of " + std::to_string(out_bytes) + " bytes exceeds the block limit");
			}
			unsigned char *z = zb.resize(out_bytes);
			cast_values(from, to, x.bytes.udata(), z, n);
			charged.add(out_bytes, "the result blobs of a chunk");
			set_blob(output, row, z, out_bytes);
		});
	});
}

} // namespace tsk
