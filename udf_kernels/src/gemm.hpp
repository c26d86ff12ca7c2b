// Binary contractions (join multiply, agg sum) as GEMM / batched GEMM.
//
// Every label of Z[lZ] = sum X[lX] * Y[lY] gets a dimension type (einsum-trees paper, Sec. 2.1):
//   B (batch, "C" in the paper): in X, Y and Z;  M: in X and Z;  N: in Y and Z;  K: in X and Y, not Z;
//   private labels (in one operand only, not in Z) are summed away while packing that operand.
// Each group fuses into one strided dimension when its labels are adjacent and in the same order in the
// operand's C-order layout; then the block is used in place (transposed or not). Otherwise the operand is
// packed once into a contiguous [B, rows, cols] copy (the same pass takes diagonals of repeated labels and
// sums private labels). Z decides the orientation: C = A*B with A = X, B = Y when N is Z's unit-stride group,
// C^T = Y^T X^T when M is; only when neither is possible is the product formed in a scratch buffer and added
// into Z. Float and complex dtypes call OpenBLAS (scipy-openblas32, single-threaded per call); integers use a
// cache-blocked native loop with wrapping arithmetic.
#pragma once

#include "dtype.hpp"
#include "spec.hpp"

#include <condition_variable>
#include <memory>
#include <mutex>

namespace tsk {

// The threads one database lets its kernels use (DuckDB's `threads` setting at load time). Every kernel call
// holds at least one token while it computes (its own DuckDB thread); a big GEMM may take more and split
// its work over that many threads. A call waits while no token is free, so kernel threads never exceed the
// total. One budget is shared by the functions registered on one database (function extra info), not global.
class ThreadBudget {
public:
	explicit ThreadBudget(int total) : total_(total < 1 ? 1 : total), free_(total_) {
	}
	int total() const {
		return total_;
	}
	// Blocks until a token is free; returns how many were granted, in [1, want].
	int acquire(int want) {
		std::unique_lock<std::mutex> lock(mu_);
		cv_.wait(lock, [this] { return free_ > 0; });
		int got = want < 1 ? 1 : (want < free_ ? want : free_);
		free_ -= got;
		return got;
	}
	void release(int n) {
		{
			std::lock_guard<std::mutex> lock(mu_);
			free_ += n;
		}
		cv_.notify_all();
	}

private:
	std::mutex mu_;
	std::condition_variable cv_;
	int total_;
	int free_;
};

using BudgetPtr = std::shared_ptr<ThreadBudget>;

// How one operand enters the GEMM: in place with strides (batch, row, col), or packed first.
struct OperandPlan {
	bool pack = false;
	std::vector<Loop> pack_outer; // B, row and col labels in packed order; Loop::sx = stride in the operand
	std::vector<Loop> pack_inner; // private labels, summed while packing
	uint64_t pack_numel = 0;
	int64_t sb = 0, sr = 0, sc = 0; // strides of the matrix the GEMM reads (the packed copy when pack)
	bool trans = false;            // BLAS: the matrix is stored column-major (unit row stride)
	int64_t ld = 1;                // BLAS leading dimension
};

// A contraction planned for one (spec, x_shape, y_shape): C[b] (m x n) += A[b] (m x k) * B[b] (k x n).
struct Contraction {
	Shape out_shape;
	uint64_t out_numel = 0;
	bool empty = false; // a label of size 0: the product contributes nothing
	bool swap = false;  // A = Y^T, B = X^T, C = Z^T
	int64_t nb = 1, m = 1, n = 1, k = 1;
	OperandPlan a, b;
	bool pack_c = false;      // form C in scratch ([B, M, N] contiguous) and add it into Z
	int64_t cb = 0, cr = 0;   // C strides (batch, row); the column stride is 1
	std::vector<Loop> unpack; // pack_c: Z's labels in Z order, Loop::sx = stride in the scratch C
	double flops = 0;
	// dimension-type summary, for tests and EXPLAIN-style introspection
	std::string kinds;
};

// Validates shapes against the spec (like make_plan) and plans the GEMM mapping. `integer` selects the
// native integer loop's layout needs (unit column stride of B) instead of BLAS's.
Contraction plan_contraction(const Spec &spec, const Shape &xs, const Shape &ys, size_t itemsize, bool integer,
                             const char *fn);

struct GemmScratch {
	AlignedBuf a, b, c;
};

// z (+)= contraction of x and y. accumulate=false overwrites z (out_numel elements). budget may be null
// (single-threaded).
template <class T>
void contract(const Contraction &c, const T *x, const T *y, T *z, bool accumulate, ThreadBudget *budget,
              GemmScratch &scratch);

// Sets OpenBLAS's own thread count to one (parallelism comes from DuckDB threads and ThreadBudget).
void blas_single_threaded();

} // namespace tsk
