// The float32 GEMM path of one database: TENSORSQL_KERNEL_PATH, read once when the extension is loaded into a
// database (each LOAD into a new DuckDB database runs the entry point) and kept in that database's ThreadBudget
// (gemm.hpp), so two databases in one process may use different paths. Nothing here is mutable.
//
//   auto      (default, also when unset or empty) avx512 when the CPU supports it, else openblas
//   avx512    float32 products on the packed AVX-512 kernel (pgemm.hpp) where it applies, OpenBLAS for the
//             rest; refused (the LOAD fails) on a CPU without AVX-512F/DQ/VL and FMA
//   openblas  never the packed kernel: every float/complex GEMM calls OpenBLAS (the AVX2 machine's path)
//   generic   no BLAS and no packed kernel: portable C++ loops for every dtype (a reference path)
#pragma once

#include <string>

namespace tsk {

enum class KernelPath { Avx512, OpenBlas, Generic };

constexpr const char *kKernelPathEnv = "TENSORSQL_KERNEL_PATH";

// "avx512", "openblas" or "generic".
const char *kernel_path_name(KernelPath path);

// What `auto` resolves to on this CPU.
KernelPath auto_kernel_path();

// Parses a value of TENSORSQL_KERNEL_PATH (nullptr or "" = auto; case-insensitive). Returns false with `error`
// set, naming the variable and the valid values, for an unknown value or for avx512 on a CPU without it.
bool parse_kernel_path(const char *value, KernelPath &out, std::string &error);

} // namespace tsk
