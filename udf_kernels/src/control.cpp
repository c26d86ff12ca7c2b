// Cancellation and progress (see control.hpp): the registry behind the C ABI, and tensorsql_db_token.
#include "control.hpp"

#include "functions.hpp"
#include "gemm.hpp"

#include <mutex>
#include <random>
#include <unordered_map>

namespace tsk {

namespace {

struct Registry {
	std::mutex mu;
	std::unordered_map<int64_t, Control *> controls;
	std::mt19937_64 rng {std::random_device {}()};
};

Registry &registry() {
	static Registry r;
	return r;
}

// Runs f(control) under the registry's mutex; -1 when no Control has the token.
template <class F>
int with_control(int64_t token, F &&f) noexcept {
	try {
		Registry &r = registry();
		std::lock_guard<std::mutex> lock(r.mu);
		auto it = r.controls.find(token);
		if (it == r.controls.end()) {
			return -1;
		}
		f(*it->second);
		return 0;
	} catch (...) {
		return -1;
	}
}

} // namespace

Control::Control() {
	Registry &r = registry();
	std::lock_guard<std::mutex> lock(r.mu);
	while (token_ == 0 || r.controls.count(token_) != 0) {
		token_ = static_cast<int64_t>(r.rng() >> 1);
	}
	r.controls.emplace(token_, this);
}

Control::~Control() {
	Registry &r = registry();
	std::lock_guard<std::mutex> lock(r.mu);
	r.controls.erase(token_);
}

void Control::interrupted(const char *fn) {
	fail(std::string(fn) + ": " + kInterrupted + " (the query was cancelled)");
}

void MemoryBudget::charge(uint64_t bytes, const char *fn, const char *what) {
	uint64_t cur = used_.load(std::memory_order_relaxed);
	while (true) {
		const uint64_t lim = limit();
		if (lim != 0 && (bytes > lim || cur > lim - bytes)) {
			fail(std::string(fn) + ": " + kOutOfMemory + ": allocating " + std::to_string(bytes) + " bytes for " +
			     what + " would pass the kernels' memory limit of " + std::to_string(lim) + " bytes (" +
			     std::to_string(cur) +
			     " in use); raise it with tensorsql.connect(memory_limit=...), or use smaller blocks "
			     "(connect(max_block_bytes=...))");
		}
		if (used_.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed)) {
			return;
		}
	}
}

void memory_charge(MemoryBudget *m, uint64_t bytes, const char *fn, const char *what) {
	if (m != nullptr) {
		m->charge(bytes, fn, what);
	}
}

void memory_release(MemoryBudget *m, uint64_t bytes) noexcept {
	if (m != nullptr && bytes != 0) {
		m->release(bytes);
	}
}

void out_of_memory(const char *fn, const char *what, uint64_t bytes) {
	fail(std::string(fn) + ": " + kOutOfMemory + ": the system could not allocate " + std::to_string(bytes) +
	     " bytes for " + what + "; lower tensorsql.connect(memory_limit=...) below the memory this machine has");
}

void Control::reset() noexcept {
	done_.store(0, std::memory_order_relaxed);
	total_.store(0, std::memory_order_relaxed);
	cancel_.store(false, std::memory_order_relaxed);
}

void tensorsql_db_token(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensorsql_db_token";
	guard_scalar(info, FN, [&] {
		ThreadBudget *budget = budget_of(duckdb_scalar_function_get_extra_info(info));
		if (budget == nullptr) {
			fail(std::string(FN) + ": no kernel state");
		}
		const int64_t token = budget->control().token();
		int64_t *out = static_cast<int64_t *>(duckdb_vector_get_data(output));
		const idx_t count = duckdb_data_chunk_get_size(input);
		for (idx_t row = 0; row < count; row++) {
			out[row] = token;
		}
	});
}

} // namespace tsk

extern "C" {

int tensorsql_cancel(int64_t token) {
	return tsk::with_control(token, [](tsk::Control &c) { c.cancel(); });
}

int tensorsql_reset(int64_t token) {
	return tsk::with_control(token, [](tsk::Control &c) { c.reset(); });
}

int tensorsql_progress(int64_t token, double *done, double *total) {
	if (done == nullptr || total == nullptr) {
		return -1;
	}
	return tsk::with_control(token, [&](const tsk::Control &c) { c.progress(*done, *total); });
}

int tensorsql_memory_limit(int64_t token, uint64_t bytes) {
	return tsk::with_control(token, [&](tsk::Control &c) { c.memory().set_limit(bytes); });
}

int tensorsql_memory(int64_t token, uint64_t *used, uint64_t *limit) {
	if (used == nullptr || limit == nullptr) {
		return -1;
	}
	return tsk::with_control(token, [&](tsk::Control &c) {
		*used = c.memory().used();
		*limit = c.memory().limit();
	});
}
}
