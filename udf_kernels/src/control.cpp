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
}
