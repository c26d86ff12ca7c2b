// TENSORSQL_KERNEL_PATH (kernel_path.hpp) and the SQL function tensorsql_kernel_path().
#include "kernel_path.hpp"

#include "functions.hpp"
#include "gemm.hpp"
#include "pgemm.hpp"

#include <cctype>

namespace tsk {

const char *kernel_path_name(KernelPath path) {
	switch (path) {
	case KernelPath::Avx512:
		return "avx512";
	case KernelPath::OpenBlas:
		return "openblas";
	case KernelPath::Generic:
		return "generic";
	}
	return "generic";
}

KernelPath auto_kernel_path() {
	return pgemm::supported() ? KernelPath::Avx512 : KernelPath::OpenBlas;
}

bool parse_kernel_path(const char *value, KernelPath &out, std::string &error) {
	std::string v = value == nullptr ? "" : value;
	for (char &ch : v) {
		ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
	}
	const std::string valid = "valid values: auto (the default), avx512, openblas, generic";
	if (v.empty() || v == "auto") {
		out = auto_kernel_path();
		return true;
	}
	if (v == "openblas") {
		out = KernelPath::OpenBlas;
		return true;
	}
	if (v == "generic") {
		out = KernelPath::Generic;
		return true;
	}
	if (v == "avx512") {
		if (!pgemm::supported()) {
			error = std::string("tensorsql_kernels: ") + kKernelPathEnv +
			        "=avx512, but this CPU lacks AVX-512 (the packed kernel needs AVX-512F/DQ/VL and FMA); " + valid;
			return false;
		}
		out = KernelPath::Avx512;
		return true;
	}
	error = std::string("tensorsql_kernels: invalid ") + kKernelPathEnv + "=" + quoted(valid_utf8(value)) + "; " + valid;
	return false;
}

void tensorsql_kernel_path(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	guard_scalar(info, "tensorsql_kernel_path", [&] {
		const char *name = kernel_path_name(kernel_path_of(budget_of(duckdb_scalar_function_get_extra_info(info))));
		const idx_t count = duckdb_data_chunk_get_size(input);
		for (idx_t row = 0; row < count; row++) {
			duckdb_vector_assign_string_element(output, row, name);
		}
	});
}

} // namespace tsk
