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
// into Z. Float and complex dtypes call OpenBLAS (scipy-openblas32, single-threaded per call), float32 with a
// short K the packed AVX-512 kernel (pgemm.hpp), as the database's kernel path allows (kernel_path.hpp; the
// generic path uses a portable loop instead); integers use a cache-blocked native loop with wrapping arithmetic.
#pragma once

#include "control.hpp"
#include "dtype.hpp"
#include "kernel_path.hpp"
#include "spec.hpp"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <memory>
#include <typeindex>
#include <unordered_map>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>

namespace tsk {

// The threads one database lets its kernels use (DuckDB's `threads` setting at load time). Every kernel call
// holds at least one token while it computes (its own DuckDB thread); a big GEMM may take more and split
// its work over that many threads. A call waits while no token is free, so kernel threads never exceed the
// total. One budget is shared by the functions registered on one database (function extra info), not global.
//
// The budget also owns that database's helper threads: a persistent pool of at most total-1 workers, started
// on first use and joined when the budget is destroyed (with the functions' extra info). A call holding g
// tokens runs g-1 tasks there; since helper tasks in flight never exceed the tokens held beyond one per call,
// a task never waits for a busy worker for long, and the caller itself runs any task no worker has taken yet,
// so a job always completes even when no worker thread could be started.
//
// It also carries the database's GEMM path (TENSORSQL_KERNEL_PATH at load time, kernel_path.hpp): fixed at
// construction, so every thread reads it without locking.
class ThreadBudget {
public:
	explicit ThreadBudget(int total, KernelPath path = auto_kernel_path())
	    : total_(total < 1 ? 1 : total), free_(total_), path_(path) {
	}
	ThreadBudget(const ThreadBudget &) = delete;
	ThreadBudget &operator=(const ThreadBudget &) = delete;
	~ThreadBudget() {
		{
			std::lock_guard<std::mutex> lock(pool_mu_);
			stop_ = true;
		}
		pool_cv_.notify_all();
		for (auto &w : workers_) {
			w.join();
		}
	}
	int total() const {
		return total_;
	}
	// The database's cancellation flag and progress counters (control.hpp).
	Control &control() {
		return control_;
	}
	KernelPath path() const {
		return path_;
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

	// Calls body(i) for every i in [0, n): i = 0 on the calling thread, the others on pool workers (or on the
	// caller when no worker takes them first). Returns when all are done; an exception of any body (an
	// allocation refused by the memory budget, say) is caught where it ran and the first one rethrown here,
	// once every body has returned (they share the caller's stack).
	template <class F>
	void run(int n, F &&body) {
		if (n <= 1) {
			if (n == 1) {
				body(0);
			}
			return;
		}
		Job job;
		job.fn = [](void *ctx, int i) { (*static_cast<std::remove_reference_t<F> *>(ctx))(i); };
		job.ctx = static_cast<void *>(&body);
		job.pending = n - 1;
		{
			std::lock_guard<std::mutex> lock(pool_mu_);
			start_workers_locked(n - 1);
			for (int i = 1; i < n; i++) {
				queue_.push_back(Task {&job, i});
			}
		}
		if (n - 1 == 1) {
			pool_cv_.notify_one();
		} else {
			pool_cv_.notify_all();
		}
		try {
			body(0);
		} catch (...) {
			job.fail(std::current_exception());
		}
		// Run our own tasks that no worker has started yet, then wait for the rest.
		while (true) {
			Task t {nullptr, 0};
			{
				std::lock_guard<std::mutex> lock(pool_mu_);
				for (auto it = queue_.begin(); it != queue_.end(); ++it) {
					if (it->job == &job) {
						t = *it;
						queue_.erase(it);
						break;
					}
				}
			}
			if (t.job == nullptr) {
				break;
			}
			execute(t);
		}
		std::unique_lock<std::mutex> lock(job.mu);
		job.cv.wait(lock, [&job] { return job.pending == 0; });
		if (job.error) {
			std::rethrow_exception(job.error);
		}
	}

private:
	struct Job {
		void (*fn)(void *, int) = nullptr;
		void *ctx = nullptr;
		int pending = 0;
		std::exception_ptr error; // the first body's exception (under mu)
		std::mutex mu;
		std::condition_variable cv;
		void fail(std::exception_ptr e) {
			std::lock_guard<std::mutex> lock(mu);
			if (!error) {
				error = std::move(e);
			}
		}
	};
	struct Task {
		Job *job;
		int index;
	};

	static void execute(const Task &t) {
		try {
			t.job->fn(t.job->ctx, t.index);
		} catch (...) {
			t.job->fail(std::current_exception());
		}
		std::lock_guard<std::mutex> lock(t.job->mu);
		if (--t.job->pending == 0) {
			t.job->cv.notify_all();
		}
	}

	// Starts workers up to min(want, total-1); a thread that cannot be started is simply not there.
	void start_workers_locked(int want) {
		const size_t target = static_cast<size_t>(std::min(want, total_ - 1));
		while (workers_.size() < target) {
			try {
				workers_.emplace_back([this] { worker_loop(); });
			} catch (...) {
				return;
			}
		}
	}

	void worker_loop() {
		std::unique_lock<std::mutex> lock(pool_mu_);
		while (true) {
			pool_cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
			if (queue_.empty()) {
				return; // stop_
			}
			const Task t = queue_.front();
			queue_.pop_front();
			lock.unlock();
			execute(t);
			lock.lock();
		}
	}

public:
	// Per-database state the kernels keep across calls, one of each type T, made on first use (parsed
	// programs of tensor_program_into, by text). T must be thread-safe itself: every call shares it.
	template <class T>
	T &state() {
		std::lock_guard<std::mutex> lock(state_mu_);
		std::shared_ptr<void> &p = states_[std::type_index(typeid(T))];
		if (!p) {
			p = std::make_shared<T>();
		}
		return *static_cast<T *>(p.get());
	}

private:
	std::mutex mu_;
	std::condition_variable cv_;
	int total_;
	int free_;
	const KernelPath path_;
	std::mutex state_mu_;
	std::unordered_map<std::type_index, std::shared_ptr<void>> states_;

	std::mutex pool_mu_;
	std::condition_variable pool_cv_;
	std::deque<Task> queue_;
	std::vector<std::thread> workers_;
	bool stop_ = false;

	Control control_;
};

using BudgetPtr = std::shared_ptr<ThreadBudget>;

inline Control *control_of(ThreadBudget *budget) {
	return budget != nullptr ? &budget->control() : nullptr;
}

// Tokens taken from a budget (acquire), given back when it goes out of scope.
struct Lease {
	ThreadBudget *budget;
	int n;
	~Lease() {
		if (budget != nullptr) {
			budget->release(n);
		}
	}
};

// Splits [0, chunks) into `threads` contiguous ranges run on the budget's pool (the first on this thread).
template <class F>
void parallel_chunks(ThreadBudget *budget, int threads, int64_t chunks, F &&body) {
	if (budget == nullptr || threads <= 1 || chunks <= 1) {
		body(int64_t(0), chunks);
		return;
	}
	const int t = static_cast<int>(chunks < threads ? chunks : threads);
	budget->run(t, [&](int i) { body(chunks * i / t, chunks * (i + 1) / t); });
}

// How many threads a memory-bound loop over `elements` elements may use (at most `total`): a pool hand-off
// costs ~10 us, an element of an element-wise step ~0.5-2 ns, so a thread takes at least kLoopElementsPerThread.
constexpr double kLoopElementsPerThread = 262144.0;
inline int loop_threads_wanted(double elements, int total) {
	const double w = elements / kLoopElementsPerThread;
	return w >= total ? total : (w < 1 ? 1 : static_cast<int>(w));
}

// The database's kernel memory budget (control.hpp), or null without a budget (nothing is charged then).
inline MemoryBudget *memory_of(ThreadBudget *budget) {
	return budget != nullptr ? &budget->control().memory() : nullptr;
}

// The GEMM path of the database whose budget this is (auto's choice without a budget).
inline KernelPath kernel_path_of(const ThreadBudget *budget) {
	return budget != nullptr ? budget->path() : auto_kernel_path();
}

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
	// pack_c with a large C: C is formed in cache-sized tiles (a sub-box of M x a sub-box of N per batch),
	// each scattered into Z while still in cache, instead of one big scratch C written and read back.
	struct ZLabel {
		int64_t size, zstride;
		int group; // 0 batch, 1 M, 2 N
		int index; // position within its group (canonical order = Z order)
	};
	struct GroupTiles {
		std::vector<int64_t> sizes; // the group's label sizes
		size_t level = 0;           // labels before it: one value per tile; this one: `range` values; after: all
		int64_t range = 1;
		int64_t count = 1; // tiles
		int64_t rows = 1;  // elements of a full tile
		// Fills start/len (per label of the group) for tile t; returns the tile's linear start in the group.
		int64_t tile(int64_t t, int64_t *start, int64_t *len) const;
	};
	bool tiled = false;
	std::vector<ZLabel> zlabels;
	GroupTiles bt, mt, nt;
	double flops = 0;
	// dimension-type summary, for tests and EXPLAIN-style introspection
	// the SQL function this contraction serves (a string literal), named by its errors
	const char *fn = "contraction";
	std::string kinds;
};

// Validates shapes against the spec (like make_plan) and plans the GEMM mapping. `integer` selects the
// native integer loop's layout needs (unit column stride of B) instead of BLAS's.
Contraction plan_contraction(const Spec &spec, const Shape &xs, const Shape &ys, size_t itemsize, bool integer,
                             const char *fn);

// A GEMM caller's working buffers, and its database's kernel path (ThreadBudget::path(), kernel_path.hpp):
// contract() takes the path from here, since the budget it is given may be null (a single-threaded GEMM).
struct GemmScratch {
	// mem: the budget the packed copies and the product scratch are charged to (null: none)
	explicit GemmScratch(KernelPath kernel_path, MemoryBudget *mem = nullptr)
	    : path(kernel_path), a(mem, "contraction", "a packed operand"), b(mem, "contraction", "a packed operand"),
	      c(mem, "contraction", "the product's scratch") {
	}
	KernelPath path;
	AlignedBuf a, b, c;
	// Where contract() checks for cancellation and counts its work when it is called without a budget (a
	// single-threaded GEMM of a threaded caller); with a budget, the budget's Control.
	Control *control = nullptr;
};

// z (+)= contraction of x and y. accumulate=false overwrites z (out_numel elements). budget may be null
// (single-threaded). packed_out (only meaningful when c.pack_c): z holds C in its GEMM layout ([B, M, N]
// contiguous; c.unpack maps it to Z's order) and the product is added there without the scatter into Z.
// Cancellation: a long product runs in steps of bounded work (K panels, tiles, batches); it stops between steps
// when its Control (scratch.control, else the budget's) is cancelled, and then fails with the interrupted error.
// It counts the flops it finished there.
template <class T>
void contract_native(const Contraction &c, const T *x, const T *y, T *z, bool accumulate, ThreadBudget *budget,
                     GemmScratch &scratch, bool packed_out = false);

// The type a GEMM of T runs in: an unsigned integer type multiplies and adds as its signed twin (the same bits
// under wrapping arithmetic, and the signed/unsigned variants of a type may alias), so the integer loop is
// compiled once per width.
template <class T, bool = std::is_integral_v<T>>
struct gemm_twin {
	using type = T;
};
template <class T>
struct gemm_twin<T, true> {
	using type = std::make_signed_t<T>;
};

template <class T>
inline void contract(const Contraction &c, const T *x, const T *y, T *z, bool accumulate, ThreadBudget *budget,
                     GemmScratch &scratch, bool packed_out = false) {
	using G = typename gemm_twin<T>::type;
	contract_native<G>(c, reinterpret_cast<const G *>(x), reinterpret_cast<const G *>(y), reinterpret_cast<G *>(z),
	                   accumulate, budget, scratch, packed_out);
}

// How many threads `flops` of GEMM work is worth (at least 1, at most total); complex flops count 4x.
int gemm_threads_wanted(double flops, int total);

// Sets OpenBLAS's own thread count to one (parallelism comes from DuckDB threads and ThreadBudget).
void blas_single_threaded();

} // namespace tsk
