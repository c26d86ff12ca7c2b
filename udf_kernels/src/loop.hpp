// The generic strided loop of tensor_einsum, tensor_einsum_agg and tensor_einsum1: every join and aggregation
// (multiply/sum contractions run as GEMM instead, gemm.hpp).
//
// Z[lZ] = AGG over the labels not in lZ of JOIN(X[lX], Y[lY]). Every label gets a loop with a stride per
// operand; the output labels form the outer loops (so Z is written in C order) and the aggregated labels the
// inner loops, accumulated in a register (a float or complex sum pairwise, pairwise.hpp). O(product of label
// sizes), no per-element allocation or parsing.
//
// The loop is instantiated for every dtype x join x aggregation: loop_impl.hpp holds the templates, and
// loop_float.cpp and loop_int.cpp instantiate them for the float/complex and the integer dtypes, two translation
// units that compile in parallel.
#pragma once

#include "control.hpp"
#include "dtype.hpp"
#include "ops.hpp"
#include "spec.hpp"

#include <string>

namespace tsk {

class ThreadBudget;

// z = the AGG-reduction of JOIN(x, y) over plan p's inner loops, or with `accumulate` z[i] = AGG(z[i], it).
// With the database's budget (gemm.hpp; null: none) and over ~2e8 flops it runs the output's outer loops in
// steps, checking for cancellation and counting progress between them; a big output is split over the budget's
// threads (each element computed as in one call, so the same result).
template <class T>
void run_join_steps(ThreadBudget *budget, Join join, Agg agg, const Plan &p, const T *x, const T *y, T *z,
                    bool accumulate, const char *fn);

// z = the AGG-reduction of x over plan p's inner loops (tensor_einsum1: transposes, diagonals, reductions),
// split over the budget's threads when big (as run_join_steps).
template <class T>
void run_unary(ThreadBudget *budget, Agg agg, const Plan &p, const T *x, T *z, const char *fn);

[[noreturn]] inline void not_for_complex(const char *fn, const char *what, const char *name, const char *dtype) {
	fail(std::string(fn) + ": " + what + " '" + name + "' is not defined for complex (dtype " + dtype + ")");
}

} // namespace tsk
