// tensor_einsum_path: a tree of binary multiply/sum contractions of single blocks, run as one call.
//
// When every tensor of an einsum tree is one block, each step of the tree as its own join + group-by costs
// DuckDB a fixed ~0.5-1 ms (hash table build, per-thread aggregate tables, pipeline scheduling, the result
// blob copied into a DuckDB vector), which is as much as the GEMMs of a small tree. Here the tree's steps run
// back to back inside one call over the cross join of its input blocks; intermediates live in the call's own
// buffers and are freed after their last use. Every step is a GEMM (contract), threaded by the database's
// thread budget like any other kernel call.
//
// program: steps separated by ';', each "i,j:spec" with spec a binary einsum ('abc,cd->abd'); i and j name
// operands: 0..n-1 are the blob arguments, n+k is the result of step k. The last step's result is returned.
// shapes: the input blocks' shapes concatenated (each input's rank is that of its labels in the spec of the
// step that first reads it).
//
// A NULL block (an input without its block: a side of the positional join with no row) gives a NULL result,
// which every consumer reads as an absent block, zeros, as it reads a NULL product of a join.
#include "functions.hpp"
#include "gemm.hpp"
#include "sink.hpp"
#include "rows.hpp"

#include <utility>

namespace tsk {
namespace {

struct PathStep {
	int x = 0, y = 0;
	Spec spec;
};

struct Program {
	int n_inputs = 0;
	std::vector<PathStep> steps;
	std::vector<size_t> rank;     // per input
	std::vector<size_t> last_use; // per operand (inputs, then steps): the last step that reads it
	std::string text;
};

int parse_index(const std::string &s, const std::string &where) {
	if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) {
		fail(where + "operand " + quoted(valid_utf8(s)) + " is not a non-negative integer");
	}
	return std::stoi(s);
}

Program parse_program(const Bytes &b, int n_inputs, const char *fn) {
	Program p;
	p.n_inputs = n_inputs;
	p.text = b.str();
	const std::string where = std::string(fn) + ": bad program " + quoted(valid_utf8(p.text)) + ": ";
	if (n_inputs < 2) {
		fail(where + "needs at least 2 input blocks, got " + std::to_string(n_inputs));
	}
	p.rank.assign(static_cast<size_t>(n_inputs), 0);
	size_t start = 0;
	while (start <= p.text.size()) {
		size_t semi = p.text.find(';', start);
		const std::string step = p.text.substr(start, semi == std::string::npos ? std::string::npos : semi - start);
		const size_t colon = step.find(':');
		const size_t comma = step.find(',');
		if (colon == std::string::npos || comma == std::string::npos || comma > colon) {
			fail(where + "step " + quoted(valid_utf8(step)) + " is not 'i,j:spec'");
		}
		PathStep s;
		s.x = parse_index(step.substr(0, comma), where);
		s.y = parse_index(step.substr(comma + 1, colon - comma - 1), where);
		const int available = n_inputs + static_cast<int>(p.steps.size());
		for (int i : {s.x, s.y}) {
			if (i >= available) {
				fail(where + "step " + std::to_string(p.steps.size()) + " reads operand " + std::to_string(i) +
				     ", but only " + std::to_string(available) + " exist before it");
			}
		}
		const std::string spec = step.substr(colon + 1);
		s.spec = parse_spec(Bytes {spec.data(), spec.size()}, 2, fn);
		for (int k = 0; k < 2; k++) {
			const int i = k == 0 ? s.x : s.y;
			const size_t r = s.spec.inputs[k].size();
			if (i < n_inputs) {
				size_t &have = p.rank[static_cast<size_t>(i)];
				if (have == 0) {
					have = r == 0 ? SIZE_MAX : r; // SIZE_MAX: a scalar block (rank 0)
				} else if ((have == SIZE_MAX ? 0 : have) != r) {
					fail(where + "input " + std::to_string(i) + " is read with ranks " +
					     std::to_string(have == SIZE_MAX ? 0 : have) + " and " + std::to_string(r));
				}
			}
		}
		p.steps.push_back(std::move(s));
		if (semi == std::string::npos) {
			break;
		}
		start = semi + 1;
	}
	for (int i = 0; i < n_inputs; i++) {
		size_t &r = p.rank[static_cast<size_t>(i)];
		if (r == 0) {
			fail(where + "input " + std::to_string(i) + " is never read");
		}
		r = r == SIZE_MAX ? 0 : r;
	}
	p.last_use.assign(static_cast<size_t>(n_inputs) + p.steps.size(), 0);
	for (size_t k = 0; k < p.steps.size(); k++) {
		p.last_use[static_cast<size_t>(p.steps[k].x)] = k;
		p.last_use[static_cast<size_t>(p.steps[k].y)] = k;
	}
	return p;
}

// One operand of a step: an input blob (read in place when aligned) or a step's result.
struct Value {
	const unsigned char *data = nullptr;
	Shape shape;
	AlignedBuf own;
};

// Runs a program row by row, with the caches and scratch of one call.
class PathRunner {
public:
	PathRunner(duckdb_data_chunk input, idx_t first, ThreadBudget *budget)
	    : prog_c_(input, first), dtype_c_(input, first + 1), shapes_c_(input, first + 2), first_blob_(first + 3),
	      budget_(budget), scratch_(kernel_path_of(budget), memory_of(budget)) {
		const idx_t cols = duckdb_data_chunk_get_column_count(input);
		for (idx_t c = first_blob_; c < cols; c++) {
			blobs_.emplace_back(input, c);
		}
	}
	bool valid(idx_t row) const {
		if (!all_valid(prog_c_, dtype_c_, shapes_c_)(row)) {
			return false;
		}
		for (const auto &b : blobs_) {
			if (!b.valid(row)) {
				return false;
			}
		}
		return true;
	}
	// Reads and validates row r; returns the result's shape. Steps are planned once per (program, shapes).
	const Shape &prepare(idx_t row, const char *fn) {
		const int n = static_cast<int>(blobs_.size());
		prog_ = &programs_.get(prog_c_.str(row), [&](const Bytes &b) { return parse_program(b, n, fn); });
		dt_ = dtype_c_.get(row, fn);
		shapes_c_.get(row, flat_, fn, "shapes");
		size_t need = 0;
		for (size_t r : prog_->rank) {
			need += r;
		}
		if (flat_.size() != need) {
			fail(std::string(fn) + ": shapes has " + std::to_string(flat_.size()) + " entries, but the program's " +
			     std::to_string(n) + " inputs have " + std::to_string(need) + " dimensions");
		}
		values_.resize(static_cast<size_t>(n) + prog_->steps.size());
		size_t at = 0;
		for (int i = 0; i < n; i++) {
			Value &v = values_[static_cast<size_t>(i)];
			const size_t r = prog_->rank[static_cast<size_t>(i)];
			v.shape.assign(flat_.begin() + static_cast<std::ptrdiff_t>(at),
			               flat_.begin() + static_cast<std::ptrdiff_t>(at + r));
			at += r;
			const std::string name = "input " + std::to_string(i);
			const Bytes b = blobs_[static_cast<size_t>(i)].str(row);
			check_operand(fn, name.c_str(), b, v.shape, dt_);
			v.data = reinterpret_cast<const unsigned char *>(b.data);
			if (reinterpret_cast<uintptr_t>(b.data) % itemsize(dt_) != 0) { // DuckDB's blobs are aligned
				v.own.charge_to(memory_of(budget_), fn, "an aligned copy of an input");
				std::memcpy(v.own.resize(b.size), b.data, b.size);
				v.data = v.own.data();
			}
		}
		if (plans_text_ != prog_->text || plans_dt_ != dt_ || plan_shapes_ != flat_) {
			plans_.clear();
			for (size_t k = 0; k < prog_->steps.size(); k++) {
				const PathStep &s = prog_->steps[k];
				const Shape &xs = values_[static_cast<size_t>(s.x)].shape;
				const Shape &ys = values_[static_cast<size_t>(s.y)].shape;
				plans_.push_back(plan_contraction(s.spec, xs, ys, itemsize(dt_), is_integer_dtype(dt_), fn));
				values_[static_cast<size_t>(n) + k].shape = plans_.back().out_shape;
			}
			plans_text_ = prog_->text;
			plans_dt_ = dt_;
			plan_shapes_ = flat_;
		}
		return plans_.back().out_shape;
	}
	DType dtype() const {
		return dt_;
	}
	uint64_t numel() const {
		return plans_.back().out_numel;
	}
	// Runs the prepared row; the last step writes `out` (numel() elements) when given, else a buffer of its own
	// (result()).
	template <class T>
	void run(T *out) {
		const size_t n = static_cast<size_t>(prog_->n_inputs);
		const size_t last = prog_->steps.size() - 1;
		for (size_t k = 0; k <= last; k++) {
			check(control_of(budget_), "tensor_einsum_path");
			const PathStep &s = prog_->steps[k];
			const Contraction &c = plans_[k];
			Value &z = values_[n + k];
			z.own.charge_to(memory_of(budget_), "tensor_einsum_path", "a step's result");
			T *zp = k == last && out != nullptr ? out
			                                    : reinterpret_cast<T *>(z.own.resize(c.out_numel * sizeof(T)));
			z.data = reinterpret_cast<const unsigned char *>(zp);
			contract<T>(c, reinterpret_cast<const T *>(values_[static_cast<size_t>(s.x)].data),
			            reinterpret_cast<const T *>(values_[static_cast<size_t>(s.y)].data), zp, false, budget_,
			            scratch_);
			for (int i : {s.x, s.y}) { // intermediates die after their last use
				if (static_cast<size_t>(i) >= n && prog_->last_use[static_cast<size_t>(i)] == k) {
					values_[static_cast<size_t>(i)].own = AlignedBuf();
				}
			}
		}
		for (size_t i = 0; i < n; i++) { // no input blob is kept past its row
			values_[i].own = AlignedBuf();
		}
	}
	const unsigned char *result() const {
		return values_.back().data;
	}
	void release_result() {
		values_.back().own = AlignedBuf();
	}

private:
	Col prog_c_;
	DTypeCol dtype_c_;
	ListCol shapes_c_;
	idx_t first_blob_;
	std::vector<Col> blobs_;
	ThreadBudget *budget_;
	Cached<Program> programs_;
	const Program *prog_ = nullptr;
	DType dt_ {};
	Shape flat_;
	std::vector<Value> values_;
	std::vector<Contraction> plans_;
	std::string plans_text_;
	DType plans_dt_ {};
	Shape plan_shapes_;
	GemmScratch scratch_;
};

} // namespace

void tensor_einsum_path(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensor_einsum_path";
	guard_scalar(info, FN, [&] {
		ThreadBudget *budget = budget_of(duckdb_scalar_function_get_extra_info(info));
		PathRunner runner(input, 0, budget);
		CallCharge charged(memory_of(budget), FN);
		scalar_rows(input, output, all_valid(runner), [&](idx_t row) {
			runner.prepare(row, FN);
			dispatch(runner.dtype(), [&](auto tag) {
				using T = typename decltype(tag)::type;
				runner.run<T>(static_cast<T *>(nullptr));
			});
			charged.add(runner.numel() * itemsize(runner.dtype()), "the result blobs of a chunk");
			set_blob(output, row, runner.result(), runner.numel() * itemsize(runner.dtype()));
			runner.release_result();
		});
	});
}

// tensor_einsum_path_into(key, start, <tensor_einsum_path's arguments>) -> BIGINT: the result written into a
// result sink at `start` (the last step's GEMM writes the caller's array directly when the block is one
// contiguous run of it); returns the elements written.
void tensor_einsum_path_into(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensor_einsum_path_into";
	guard_scalar(info, FN, [&] {
		SinkArgs sargs(input);
		PathRunner runner(input, 2, budget_of(duckdb_scalar_function_get_extra_info(info)));
		int64_t *out = static_cast<int64_t *>(duckdb_vector_get_data(output));
		scalar_rows(input, output, all_valid(sargs, runner), [&](idx_t row) {
			const Sink &sink = sargs.read(row, FN);
			const Shape zs = runner.prepare(row, FN);
			const int64_t off = sink_block_offset(sink, runner.dtype(), sargs.start, zs, FN);
			const bool direct = sink_block_contiguous(sink, zs);
			dispatch(runner.dtype(), [&](auto tag) {
				using T = typename decltype(tag)::type;
				T *base = reinterpret_cast<T *>(sink.base);
				runner.run<T>(direct ? base + off : static_cast<T *>(nullptr));
				if (!direct) {
					sink_write<T>(sink, off, zs, {}, reinterpret_cast<const T *>(runner.result()));
				}
			});
			runner.release_result();
			out[row] = static_cast<int64_t>(runner.numel());
		});
	});
}

bool register_path_functions(duckdb_connection con, const BudgetPtr &budget) {
	const Ty V = Ty::Varchar, L = Ty::ListBigInt, I = Ty::BigInt;
	// volatile: one call per row however DuckDB rearranges projections (a deterministic call in a CTE may be
	// pulled above the UNNEST that repeats its row for a positional join, and would then run once per copy)
	return add_budgeted_scalar(con, "tensor_einsum_path", {V, V, L}, Ty::Blob, tensor_einsum_path, budget, true,
	                           true) &&
	       add_budgeted_scalar(con, "tensor_einsum_path_into", {I, L, V, V, L}, I, tensor_einsum_path_into, budget,
	                           true, true);
}

} // namespace tsk
