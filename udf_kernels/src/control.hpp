// Cancellation and progress of one database's kernels: a flag the caller sets to stop them between units of
// work, and counters of the work they announced and finished. One Control belongs to each database's kernel
// state (its ThreadBudget, gemm.hpp), so a query on one database never stops or counts another's.
//
// The caller (tensorsql's Python side, udf_kernels/control.py) reaches it through the extension's C ABI with
// ctypes, like result sinks: the SQL function tensorsql_db_token() returns the database's random 63-bit token,
// then tensorsql_cancel / tensorsql_reset / tensorsql_progress work from any thread, also while a query runs
// (Ctrl-C arrives on the thread that waits for the query, not on DuckDB's threads).
//
// The registry token -> Control is process-wide mutable state beside the result sinks' table, for the same
// reason: the C ABI has no database to hang it on. It is guarded by a mutex; a Control registers itself when it
// is created and unregisters when it is destroyed (with its database's functions), and a C ABI call acts on it
// under that mutex, so it never touches a dead one.
//
// Work is counted in flops as tensorsql's planner counts them (2 * the product of a binary einsum's label
// sizes); kernels without a budget (maps, slices, the plain aggregates) count nothing: they are memory-bound
// and DuckDB's own interrupt check between chunks stops them.
//
// Memory: the Control also owns the database's MemoryBudget, a byte limit on the kernels' own memory (their
// block buffers, aggregate states and packing scratch, and the result blobs of the call in progress), which
// DuckDB's memory_limit does not see. tensorsql sets it to the session's memory_limit
// (tensorsql_memory_limit); a kernel whose allocation would pass it fails with kOutOfMemory instead of growing
// the process until the system's OOM killer ends it. 0 (the default) is no limit.
#pragma once

#include "common.hpp"

#include <atomic>
#include <cstdint>

namespace tsk {

// Every error of a cancelled kernel contains this marker; tensorsql maps it to KeyboardInterrupt.
constexpr const char *kInterrupted = "tensorsql: interrupted";

// The kernels' memory of one database (see the header comment): atomic counters, any thread.
class MemoryBudget {
public:
	void set_limit(uint64_t bytes) noexcept {
		limit_.store(bytes, std::memory_order_relaxed);
	}
	uint64_t limit() const noexcept {
		return limit_.load(std::memory_order_relaxed);
	}
	uint64_t used() const noexcept {
		return used_.load(std::memory_order_relaxed);
	}
	// Counts `bytes` as used, or fails with the out-of-memory error (naming fn and what) when that would pass
	// the limit; nothing is counted then.
	void charge(uint64_t bytes, const char *fn, const char *what);
	void release(uint64_t bytes) noexcept {
		used_.fetch_sub(bytes, std::memory_order_relaxed);
	}

private:
	std::atomic<uint64_t> limit_ {0}, used_ {0};
};

class Control {
public:
	Control();  // registers under a fresh random token
	~Control(); // unregisters
	Control(const Control &) = delete;
	Control &operator=(const Control &) = delete;

	int64_t token() const {
		return token_;
	}
	bool cancelled() const noexcept {
		return cancel_.load(std::memory_order_relaxed);
	}
	// Fails with the interrupted error (naming fn) when cancelled.
	void check(const char *fn) const {
		if (cancelled()) {
			interrupted(fn);
		}
	}
	[[noreturn]] static void interrupted(const char *fn);
	// Work a kernel call is about to do / has finished.
	void announce(double work) noexcept {
		total_.fetch_add(units(work), std::memory_order_relaxed);
	}
	void add(double work) noexcept {
		done_.fetch_add(units(work), std::memory_order_relaxed);
	}
	void cancel() noexcept {
		cancel_.store(true, std::memory_order_relaxed);
	}
	// Clears the flag and both counters (before a query, and after a cancelled one has returned).
	void reset() noexcept;
	void progress(double &done, double &total) const noexcept {
		done = static_cast<double>(done_.load(std::memory_order_relaxed));
		total = static_cast<double>(total_.load(std::memory_order_relaxed));
	}
	MemoryBudget &memory() noexcept {
		return memory_;
	}

private:
	static uint64_t units(double work) {
		return work > 0 ? static_cast<uint64_t>(work) : 0;
	}
	std::atomic<bool> cancel_ {false};
	std::atomic<uint64_t> done_ {0}, total_ {0};
	MemoryBudget memory_;
	int64_t token_ = 0;
};

inline bool cancelled(const Control *c) {
	return c != nullptr && c->cancelled();
}

inline void check(const Control *c, const char *fn) {
	if (c != nullptr) {
		c->check(fn);
	}
}

// One thread's finished work, added to its Control in batches of about kQuantum (one atomic add per ~2 ms of
// GEMM, not one per tiny batch of a batched GEMM); the rest when it goes out of scope. Null-safe.
class Meter {
public:
	static constexpr double kQuantum = 1.0e8;
	explicit Meter(Control *c) : c_(c) {
	}
	Meter(const Meter &) = delete;
	Meter &operator=(const Meter &) = delete;
	~Meter() {
		flush();
	}
	bool active() const {
		return c_ != nullptr;
	}
	bool stop() const {
		return cancelled(c_);
	}
	void add(double work) {
		pending_ += work;
		if (pending_ >= kQuantum) {
			flush();
		}
	}
	void flush() {
		if (c_ != nullptr && pending_ > 0) {
			c_->add(pending_);
		}
		pending_ = 0;
	}

private:
	Control *c_;
	double pending_ = 0;
};

// tensorsql_db_token() -> BIGINT: the token of this database's Control (a budgeted function: gemm.hpp).
void tensorsql_db_token(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);

} // namespace tsk

extern "C" {
// Sets the cancellation flag of the database with this token: its kernels stop at their next check and fail
// with an error containing "tensorsql: interrupted". 0, or -1 when no database has the token.
__attribute__((visibility("default"))) int tensorsql_cancel(int64_t token);
// Clears the flag and the progress counters. 0, or -1 when no database has the token.
__attribute__((visibility("default"))) int tensorsql_reset(int64_t token);
// The work (flops) finished and announced by the database's kernels since the last reset. 0, or -1.
__attribute__((visibility("default"))) int tensorsql_progress(int64_t token, double *done, double *total);
// Sets the byte limit of the database's kernel memory (0: none). 0, or -1 when no database has the token.
__attribute__((visibility("default"))) int tensorsql_memory_limit(int64_t token, uint64_t bytes);
// The bytes the database's kernels hold now, and their limit. 0, or -1.
__attribute__((visibility("default"))) int tensorsql_memory(int64_t token, uint64_t *used, uint64_t *limit);
}
