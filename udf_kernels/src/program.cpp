// tensor_program_into: a whole one-block plan (any DAG of einsums, maps, casts, slices) as one call, its
// results written into result sinks.
//
// A plan whose every tensor is one block runs, as SQL, one kernel call per step, each step a CTE of its own:
// DuckDB's fixed cost per step (~30-60 us: a projection, a pipeline, a result blob copied into a vector) is then
// most of a small call's time (a training step of a 13-32-3 network: 60 CTEs, 2-4 ms, for microseconds of
// arithmetic). Here the steps run back to back inside one call: the kernels of the SQL functions, called
// directly (the same code, so the same values), intermediates in the call's own buffers, each freed after its
// last use, every result written straight into the caller's array.
//
// program: ops separated by ';', each a list of space-separated fields. Values are numbered in order: every
// op but 'o' makes one.
//   i DTYPE DIMS                        the next input blob (DIMS: comma-separated sizes, '-' for a scalar)
//   e X Y SPEC JOIN AGG DTYPE           binary einsum of values X and Y (tensor_einsum)
//   u X SPEC AGG DTYPE                  unary einsum of value X (tensor_einsum1)
//   m X FN DTYPE [PARAM]                element-wise map (tensor_map)
//   c X DTYPE                           cast to DTYPE (tensor_cast)
//   s X START COUNT STEP                strided slice (tensor_slice_strided; comma lists, '-' for a scalar)
//   r X DIMS                            the same elements under another shape (no copy)
//   o X K                               write value X into the sink of sinks[K] (its whole array)
// Everything is checked when the program is parsed (indices, ranks, sizes, dtypes), and every input blob against
// its declared dtype and shape before any kernel reads it.
#include "functions.hpp"
#include "gemm.hpp"
#include "loop.hpp"
#include "rows.hpp"
#include "sink.hpp"
#include "values.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace tsk {
namespace {

constexpr const char *kFn = "tensor_program_into";

enum class Op : char { Input = 'i', Binary = 'e', Unary = 'u', Map = 'm', Cast = 'c', Slice = 's', Reshape = 'r' };

struct Step {
	Op op = Op::Input;
	int x = -1, y = -1;
	DType dt = DType::F64;
	Shape shape;
	uint64_t numel = 0;
	Spec spec;
	Join join = Join::Mul;
	Agg agg = Agg::Sum;
	bool gemm = false;
	Contraction c;
	Plan plan;
	Fn fn {};
	bool has_param = false;
	double param = 0.0;
	Shape start, count, step;
	int input = -1; // Input: its blob argument
};

struct Output {
	int value = 0;
	int sink = 0;
};

struct Program {
	std::vector<Step> steps;
	std::vector<Output> outputs;
	int n_inputs = 0;
	int n_sinks = 0;
	std::vector<size_t> last_use; // per value: the last op that reads it (aliases extend their source's)
	std::vector<int> alias_of;    // per value: the value whose buffer it shares (-1: its own)
};

std::vector<std::string> split(const std::string &s, char sep) {
	std::vector<std::string> out;
	size_t start = 0;
	while (true) {
		const size_t at = s.find(sep, start);
		out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
		if (at == std::string::npos) {
			return out;
		}
		start = at + 1;
	}
}

int64_t parse_int(const std::string &s, const std::string &where) {
	if (s.empty() || s.size() > 19) {
		fail(where + quoted(valid_utf8(s)) + " is not an integer");
	}
	char *end = nullptr;
	errno = 0;
	const long long v = std::strtoll(s.c_str(), &end, 10);
	if (errno != 0 || end != s.c_str() + s.size()) {
		fail(where + quoted(valid_utf8(s)) + " is not an integer");
	}
	return static_cast<int64_t>(v);
}

Shape parse_dims(const std::string &s, const std::string &where) {
	Shape out;
	if (s == "-") {
		return out;
	}
	for (const std::string &d : split(s, ',')) {
		out.push_back(parse_int(d, where));
	}
	return out;
}

// A step's generic strided-loop plan (tensor_einsum's and tensor_einsum1's), checked for its aggregation.
void loop_plan(Step &s, const Shape &xs, const Shape *ys) {
	static const char *const names[] = {"x", "y"};
	const Shape *shapes[] = {&xs, ys};
	s.plan = make_plan(s.spec, shapes, names, itemsize(s.dt), kFn);
	check_empty_reduction(s.plan, s.agg, s.dt, kFn);
	s.shape = s.plan.out_shape;
}

Program parse_program(const Bytes &text, int n_blobs) {
	Program p;
	const std::string all = text.str();
	const std::string where = std::string(kFn) + ": bad program: ";
	auto value = [&](const std::string &s, size_t op) {
		const int64_t v = parse_int(s, where + "op " + std::to_string(op) + ": value ");
		if (v < 0 || v >= static_cast<int64_t>(p.steps.size())) {
			fail(where + "op " + std::to_string(op) + " reads value " + s + ", but only " +
			     std::to_string(p.steps.size()) + " exist before it");
		}
		return static_cast<int>(v);
	};
	auto dtype = [&](const std::string &s) { return parse_dtype(Bytes {s.data(), s.size()}, kFn); };
	size_t n_op = 0;
	for (const std::string &line : split(all, ';')) {
		const std::vector<std::string> f = split(line, ' ');
		const std::string at = where + "op " + std::to_string(n_op) + " " + quoted(valid_utf8(line)) + ": ";
		auto want = [&](size_t lo, size_t hi) {
			if (f.size() < lo || f.size() > hi) {
				fail(at + "has " + std::to_string(f.size()) + " fields");
			}
		};
		if (f.empty() || f[0].size() != 1) {
			fail(at + "is not an op");
		}
		Step s;
		const char kind = f[0][0];
		if (kind == 'o') {
			want(3, 3);
			const int64_t sink = parse_int(f[2], at + "sink ");
			if (sink < 0 || sink >= std::numeric_limits<int>::max()) { // checked before it is narrowed
				fail(at + "sink index " + std::to_string(sink) + " is out of range");
			}
			Output o {value(f[1], n_op), static_cast<int>(sink)};
			p.n_sinks = std::max(p.n_sinks, o.sink + 1);
			p.outputs.push_back(o);
			n_op++;
			continue;
		}
		if (kind == 'i') {
			want(3, 3);
			s.op = Op::Input;
			s.dt = dtype(f[1]);
			s.shape = parse_dims(f[2], at + "size ");
			s.input = p.n_inputs++;
			if (s.input >= n_blobs) {
				fail(at + "declares input " + std::to_string(s.input) + ", but the call has " +
				     std::to_string(n_blobs) + " blobs");
			}
		} else if (kind == 'e') {
			want(7, 7);
			s.op = Op::Binary;
			s.x = value(f[1], n_op);
			s.y = value(f[2], n_op);
			s.spec = parse_spec(Bytes {f[3].data(), f[3].size()}, 2, kFn);
			s.join = parse_join(Bytes {f[4].data(), f[4].size()}, kFn);
			s.agg = parse_agg(Bytes {f[5].data(), f[5].size()}, kFn);
			s.dt = dtype(f[6]);
			const Step &x = p.steps[static_cast<size_t>(s.x)], &y = p.steps[static_cast<size_t>(s.y)];
			if (x.dt != s.dt || y.dt != s.dt) {
				fail(at + "reads values of dtypes " + std::string(dtype_name(x.dt)) + " and " + dtype_name(y.dt) + " as " + dtype_name(s.dt));
			}
			s.gemm = s.join == Join::Mul && s.agg == Agg::Sum;
			if (s.gemm) {
				s.c = plan_contraction(s.spec, x.shape, y.shape, itemsize(s.dt), is_integer_dtype(s.dt), kFn);
				s.shape = s.c.out_shape;
			} else {
				loop_plan(s, x.shape, &y.shape);
			}
		} else if (kind == 'u') {
			want(5, 5);
			s.op = Op::Unary;
			s.x = value(f[1], n_op);
			s.spec = parse_spec(Bytes {f[2].data(), f[2].size()}, 1, kFn);
			s.agg = parse_agg(Bytes {f[3].data(), f[3].size()}, kFn);
			s.dt = dtype(f[4]);
			const Step &x = p.steps[static_cast<size_t>(s.x)];
			if (x.dt != s.dt) {
				fail(at + "reads a value of dtype " + std::string(dtype_name(x.dt)) + " as " + dtype_name(s.dt));
			}
			loop_plan(s, x.shape, nullptr);
		} else if (kind == 'm') {
			want(4, 5);
			s.op = Op::Map;
			s.x = value(f[1], n_op);
			s.fn = parse_fn(Bytes {f[2].data(), f[2].size()}, kFn);
			s.dt = dtype(f[3]);
			s.has_param = f.size() == 5;
			if (s.has_param) {
				char *end = nullptr;
				s.param = std::strtod(f[4].c_str(), &end);
				if (f[4].empty() || end != f[4].c_str() + f[4].size()) {
					fail(at + "param " + quoted(valid_utf8(f[4])) + " is not a number");
				}
			}
			const Step &x = p.steps[static_cast<size_t>(s.x)];
			if (x.dt != s.dt) {
				fail(at + "maps a value of dtype " + std::string(dtype_name(x.dt)) + " as " + dtype_name(s.dt));
			}
			s.shape = x.shape;
		} else if (kind == 'c') {
			want(3, 3);
			s.op = Op::Cast;
			s.x = value(f[1], n_op);
			s.dt = dtype(f[2]);
			s.shape = p.steps[static_cast<size_t>(s.x)].shape;
		} else if (kind == 's') {
			want(5, 5);
			s.op = Op::Slice;
			s.x = value(f[1], n_op);
			const Step &x = p.steps[static_cast<size_t>(s.x)];
			s.dt = x.dt;
			s.start = parse_dims(f[2], at + "start ");
			s.count = parse_dims(f[3], at + "count ");
			s.step = parse_dims(f[4], at + "step ");
			slice_bytes(s.dt, x.shape, s.start, s.count, s.step, kFn); // every element read lies inside x
			s.shape = s.count;
		} else if (kind == 'r') {
			want(3, 3);
			s.op = Op::Reshape;
			s.x = value(f[1], n_op);
			const Step &x = p.steps[static_cast<size_t>(s.x)];
			s.dt = x.dt;
			s.shape = parse_dims(f[2], at + "size ");
			if (checked_numel(s.shape, itemsize(s.dt), kFn, "shape") != x.numel) {
				fail(at + "reshapes " + shape_str(x.shape) + " into " + shape_str(s.shape));
			}
		} else {
			fail(at + "unknown op " + quoted(valid_utf8(f[0])));
		}
		s.numel = checked_numel(s.shape, itemsize(s.dt), kFn, "a value's shape");
		p.steps.push_back(std::move(s));
		n_op++;
	}
	if (p.n_inputs != n_blobs) {
		fail(where + "declares " + std::to_string(p.n_inputs) + " inputs, but the call has " + std::to_string(n_blobs) +
		     " blobs");
	}
	if (p.outputs.empty()) {
		fail(where + "writes no output");
	}
	const size_t n = p.steps.size();
	p.alias_of.assign(n, -1);
	p.last_use.assign(n, 0);
	for (size_t k = 0; k < n; k++) {
		const Step &s = p.steps[k];
		if (s.op == Op::Reshape) {
			const int src = p.alias_of[static_cast<size_t>(s.x)];
			p.alias_of[k] = src >= 0 ? src : s.x;
		}
		for (int v : {s.x, s.y}) {
			if (v >= 0) {
				p.last_use[static_cast<size_t>(v)] = k;
			}
		}
	}
	for (const Output &o : p.outputs) {
		p.last_use[static_cast<size_t>(o.value)] = n; // read after the last op
	}
	for (size_t k = n; k-- > 0;) { // a value's buffer lives as long as any alias of it
		const int src = p.alias_of[k];
		if (src >= 0) {
			size_t &u = p.last_use[static_cast<size_t>(src)];
			u = std::max(u, p.last_use[k]);
		}
	}
	return p;
}

// The database's parsed programs, by text, kept across calls (a training step runs one program thousands of
// times: parsing it and planning its contractions took a fifth of the call). Bounded: the oldest go first.
class ProgramCache {
public:
	std::shared_ptr<const Program> get(const Bytes &text, int n_blobs) {
		std::string key = text.str();
		key += '#';
		key += std::to_string(n_blobs);
		{
			std::lock_guard<std::mutex> lock(mu_);
			auto it = map_.find(key);
			if (it != map_.end()) {
				return it->second;
			}
		}
		auto made = std::make_shared<const Program>(parse_program(text, n_blobs)); // outside the lock
		std::lock_guard<std::mutex> lock(mu_);
		auto [it, fresh] = map_.emplace(key, made);
		if (fresh) {
			order_.push_back(key);
			while (order_.size() > kEntries) {
				map_.erase(order_.front());
				order_.pop_front();
			}
		}
		return it->second;
	}

private:
	static constexpr size_t kEntries = 256;
	std::mutex mu_;
	std::unordered_map<std::string, std::shared_ptr<const Program>> map_;
	std::deque<std::string> order_;
};

struct Value {
	const unsigned char *data = nullptr;
	AlignedBuf own;
};

class ProgramRunner {
public:
	ProgramRunner(duckdb_data_chunk input, ThreadBudget *budget)
	    : sinks_c_(input, 0), prog_c_(input, 1), budget_(budget), scratch_(kernel_path_of(budget), memory_of(budget)) {
		const idx_t cols = duckdb_data_chunk_get_column_count(input);
		for (idx_t c = 2; c < cols; c++) {
			blobs_.emplace_back(input, c);
		}
	}
	bool valid(idx_t row) const {
		if (!sinks_c_.valid(row) || !prog_c_.valid(row)) {
			return false;
		}
		return std::all_of(blobs_.begin(), blobs_.end(), [row](const Col &b) { return b.valid(row); });
	}
	// Runs row r's program; returns the elements written.
	int64_t run(idx_t row) {
		const int n_blobs = static_cast<int>(blobs_.size());
		const Bytes text = prog_c_.str(row);
		if (!prog_ || !same_bytes(text, text_)) {
			prog_ = budget_ != nullptr ? budget_->state<ProgramCache>().get(text, n_blobs)
			                           : std::make_shared<const Program>(parse_program(text, n_blobs));
			text_ = text.str();
		}
		const Program &p = *prog_;
		sinks_c_.get(row, keys_, kFn, "sinks");
		if (static_cast<int>(keys_.size()) < p.n_sinks) {
			fail(std::string(kFn) + ": the program writes sink " + std::to_string(p.n_sinks - 1) + ", but sinks has " +
			     std::to_string(keys_.size()) + " keys");
		}
		sinks_.clear();
		for (const Output &o : p.outputs) { // every sink checked before anything is computed
			const Step &s = p.steps[static_cast<size_t>(o.value)];
			const Sink sink = sink_find(keys_[static_cast<size_t>(o.sink)], kFn);
			const Shape zero(s.shape.size(), 0);
			sink_block_offset(sink, s.dt, zero, s.shape, kFn);
			if (sink.shape != s.shape) {
				fail(std::string(kFn) + ": value " + std::to_string(o.value) + " of shape " + shape_str(s.shape) +
				     " does not fill sink " + std::to_string(keys_[static_cast<size_t>(o.sink)]) + " of shape " +
				     shape_str(sink.shape));
			}
			sinks_.push_back(sink);
		}
		values_.clear();
		values_.resize(p.steps.size());
		for (size_t k = 0; k < p.steps.size(); k++) {
			check(control_of(budget_), kFn);
			compute(p, k, row);
			const Step &s = p.steps[k];
			for (int v : {s.x, s.y}) { // intermediates die after their last use
				if (v >= 0 && p.last_use[static_cast<size_t>(v)] == k) {
					values_[static_cast<size_t>(v)].own = AlignedBuf();
				}
			}
		}
		// An input (or a reshape of one) is read in place from its slot's array, which may also be a sink's
		// (a writable slot given as both, or a view of the same memory): such a value is staged in a buffer
		// of its own first, so no output's write changes what another output copies from.
		const size_t n_out = p.outputs.size();
		auto bytes_of = [&](size_t i) {
			const Step &s = p.steps[static_cast<size_t>(p.outputs[i].value)];
			return s.numel * itemsize(s.dt);
		};
		staged_.resize(n_out);
		for (size_t i = 0; i < n_out; i++) {
			Value &v = values_[static_cast<size_t>(p.outputs[i].value)];
			const auto src = reinterpret_cast<uintptr_t>(v.data); // addresses of unrelated arrays: compared as integers
			const size_t n = bytes_of(i);
			for (size_t j = 0; n && j < n_out; j++) {
				const auto dst = reinterpret_cast<uintptr_t>(sinks_[j].base);
				if (src < dst + bytes_of(j) && dst < src + n) {
					staged_[i].charge_to(memory_of(budget_), kFn, "an output staged apart from the sinks");
					std::memcpy(staged_[i].resize(n), v.data, n);
					v.data = staged_[i].data();
					break;
				}
			}
		}
		int64_t written = 0;
		for (size_t i = 0; i < n_out; i++) {
			const Output &o = p.outputs[i];
			const size_t bytes = bytes_of(i);
			if (bytes) {
				std::memcpy(sinks_[i].base, values_[static_cast<size_t>(o.value)].data, bytes);
			}
			written += static_cast<int64_t>(p.steps[static_cast<size_t>(o.value)].numel);
		}
		staged_.clear();
		values_.clear();
		return written;
	}

private:
	void compute(const Program &p, size_t k, idx_t row) {
		const Step &s = p.steps[k];
		Value &z = values_[k];
		const size_t bytes = s.numel * itemsize(s.dt);
		if (s.op == Op::Input) {
			const std::string name = "input " + std::to_string(s.input);
			const Bytes b = blobs_[static_cast<size_t>(s.input)].str(row);
			check_operand(kFn, name.c_str(), b, s.shape, s.dt);
			z.data = reinterpret_cast<const unsigned char *>(b.data);
			if (reinterpret_cast<uintptr_t>(b.data) % itemsize(s.dt) != 0) {
				z.own.charge_to(memory_of(budget_), kFn, "an aligned copy of an input");
				std::memcpy(z.own.resize(b.size), b.data, b.size);
				z.data = z.own.data();
			}
			return;
		}
		const Value &x = values_[static_cast<size_t>(s.x)];
		if (s.op == Op::Reshape) {
			z.data = x.data;
			return;
		}
		z.own.charge_to(memory_of(budget_), kFn, "a value of the program");
		unsigned char *out = z.own.resize(std::max<size_t>(bytes, 1));
		z.data = out;
		switch (s.op) {
		case Op::Binary: {
			const Value &y = values_[static_cast<size_t>(s.y)];
			dispatch(s.dt, [&](auto tag) {
				using T = typename decltype(tag)::type;
				const T *xp = reinterpret_cast<const T *>(x.data), *yp = reinterpret_cast<const T *>(y.data);
				T *zp = reinterpret_cast<T *>(out);
				if (s.gemm) {
					contract<T>(s.c, xp, yp, zp, false, budget_, scratch_);
				} else {
					run_join_steps<T>(budget_, s.join, s.agg, s.plan, xp, yp, zp, false, kFn);
				}
			});
			break;
		}
		case Op::Unary:
			dispatch(s.dt, [&](auto tag) {
				using T = typename decltype(tag)::type;
				run_unary<T>(budget_, s.agg, s.plan, reinterpret_cast<const T *>(x.data), reinterpret_cast<T *>(out), kFn);
			});
			break;
		case Op::Map:
			map_values(budget_, s.dt, s.fn, x.data, out, s.numel, s.has_param, s.param, kFn);
			break;
		case Op::Cast:
			cast_values(p.steps[static_cast<size_t>(s.x)].dt, s.dt, x.data, out, s.numel);
			break;
		case Op::Slice:
			if (bytes) {
				slice_values(s.dt, p.steps[static_cast<size_t>(s.x)].shape, s.start, s.count, s.step, x.data, out);
			}
			break;
		case Op::Input:
		case Op::Reshape:
			break;
		}
	}

	ListCol sinks_c_;
	Col prog_c_;
	std::vector<Col> blobs_;
	ThreadBudget *budget_;
	std::shared_ptr<const Program> prog_;
	std::string text_;
	Shape keys_;
	std::vector<Sink> sinks_;
	std::vector<Value> values_;
	std::vector<AlignedBuf> staged_; // outputs read from memory a sink also holds (see run)
	GemmScratch scratch_;
};

} // namespace

// tensor_program_into(sinks BIGINT[], program VARCHAR, inputs BLOB...) -> BIGINT: runs the program (above) and
// writes its outputs into the result sinks; returns the elements written (a NULL input: NULL, nothing written).
void tensor_program_into(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	guard_scalar(info, kFn, [&] {
		ThreadBudget *budget = budget_of(duckdb_scalar_function_get_extra_info(info));
		ProgramRunner runner(input, budget);
		int64_t *out = static_cast<int64_t *>(duckdb_vector_get_data(output));
		scalar_rows(input, output, all_valid(runner), [&](idx_t row) { out[row] = runner.run(row); });
	});
}

bool register_program_functions(duckdb_connection con, const BudgetPtr &budget) {
	// volatile: one call per row, never folded or repeated; varargs: the input blobs
	return add_budgeted_scalar(con, "tensor_program_into", {Ty::ListBigInt, Ty::Varchar}, Ty::BigInt,
	                           tensor_program_into, budget, true, true);
}

} // namespace tsk
