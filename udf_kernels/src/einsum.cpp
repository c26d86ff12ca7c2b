// tensor_einsum (binary), tensor_einsum_agg (its fused aggregate) and tensor_einsum1 (unary): extended einsum over
// block pairs, as GEMM for multiply/sum (gemm.hpp) and the generic strided loop otherwise (loop.hpp).
#include "dtype.hpp"
#include "functions.hpp"
#include "ops.hpp"
#include "spec.hpp"
#include "gemm.hpp"
#include "agg_state.hpp"
#include "loop.hpp"
#include "permute.hpp"
#include "pgemm.hpp"
#include "sink.hpp"
#include "rows.hpp"

#include <algorithm>
#include <exception>
#include <functional>
#include <memory>

namespace tsk {

namespace {

bool gemm_dtype(DType) {
	return true; // floats/complex via BLAS, integers via the native blocked loop
}

// Remembers the value built for the last (spec, shapes, dtype): shapes change only at ragged edges.
template <class V>
class LastCache {
public:
	template <class Build>
	const V &get(const Spec &spec, const Shape &xs, const Shape &ys, DType dt, Build &&build) {
		if (!has_ || dt != dt_ || spec.text != spec_ || xs != xs_ || ys != ys_) {
			v_ = build();
			spec_ = spec.text;
			xs_ = xs;
			ys_ = ys;
			dt_ = dt;
			has_ = true;
		}
		return v_;
	}

private:
	bool has_ = false;
	std::string spec_;
	Shape xs_, ys_;
	DType dt_ {};
	V v_;
};

// GEMM mapping of a binary spec.
class ContractionCache {
public:
	const Contraction &get(const Spec &spec, const Shape &xs, const Shape &ys, DType dt, const char *fn) {
		return cache_.get(spec, xs, ys, dt,
		                  [&] { return plan_contraction(spec, xs, ys, itemsize(dt), is_integer_dtype(dt), fn); });
	}

private:
	LastCache<Contraction> cache_;
};

// Generic strided-loop plan of a binary spec.
class PlanCache {
public:
	const Plan &get(const Spec &spec, const Shape &xs, const Shape &ys, DType dt, const char *fn) {
		return cache_.get(spec, xs, ys, dt, [&] {
			static const char *const names[] = {"x", "y"};
			const Shape *shapes[] = {&xs, &ys};
			return make_plan(spec, shapes, names, itemsize(dt), fn);
		});
	}

private:
	LastCache<Plan> cache_;
};


// The arguments of tensor_einsum / tensor_einsum_agg (same signature), read row by row.
struct EinsumArgs {
	Col spec_c, join_c, agg_c;
	DTypeCol dtype_c;
	BlockCol x, y;
	Cached<Spec> specs;
	Cached<Join> joins;
	Cached<Agg> aggs;

	// first: the column of spec (the *_into variants take a sink key and a start before it)
	explicit EinsumArgs(duckdb_data_chunk input, idx_t first = 0)
	    : spec_c(input, first), join_c(input, first + 1), agg_c(input, first + 2), dtype_c(input, first + 3),
	      x(input, first + 4, first + 5, "x"), y(input, first + 6, first + 7, "y") {
	}
	bool valid(idx_t row) const {
		return all_valid(spec_c, join_c, agg_c, dtype_c, x, y)(row);
	}
	const Shape &xs() const {
		return x.shape;
	}
	const Shape &ys() const {
		return y.shape;
	}
	struct Row {
		const Spec *spec;
		Join join;
		Agg agg;
		DType dt;
		Bytes xb, yb;
	};
	// Parses and validates row `row`: both blocks against their shapes before anything reads them.
	Row read(idx_t row, const char *fn) {
		Row r;
		r.spec = &specs.get(spec_c.str(row), [fn](const Bytes &b) { return parse_spec(b, 2, fn); });
		r.join = joins.get(join_c.str(row), [fn](const Bytes &b) { return parse_join(b, fn); });
		r.agg = aggs.get(agg_c.str(row), [fn](const Bytes &b) { return parse_agg(b, fn); });
		r.dt = dtype_c.get(row, fn);
		x.read(row, r.dt, fn);
		y.read(row, r.dt, fn);
		r.xb = x.bytes;
		r.yb = y.bytes;
		return r;
	}
};


} // namespace

namespace {

// One row's block product (the GEMM mapping for multiply/sum, the generic loop otherwise) with the caches and
// scratch of one call: tensor_einsum returns it as a blob, tensor_einsum_into writes it into a result sink.
class RowProduct {
public:
	RowProduct(ThreadBudget *budget, const char *fn)
	    : budget_(budget), scratch_(kernel_path_of(budget), memory_of(budget)),
	      xa_(memory_of(budget), fn, "an aligned copy of operand x"),
	      ya_(memory_of(budget), fn, "an aligned copy of operand y"), zb_(memory_of(budget), fn, "the output block") {
	}
	// Plans row r's product (args holds its shapes); returns the output block's shape.
	const Shape &plan(const EinsumArgs &args, const EinsumArgs::Row &r, const char *fn) {
		gemm_ = r.join == Join::Mul && r.agg == Agg::Sum && gemm_dtype(r.dt);
		if (gemm_) {
			c_ = &contractions_.get(*r.spec, args.xs(), args.ys(), r.dt, fn);
			numel_ = c_->out_numel;
			return c_->out_shape;
		}
		plan_ = &plans_.get(*r.spec, args.xs(), args.ys(), r.dt, fn);
		check_empty_reduction(*plan_, r.agg, r.dt, fn);
		numel_ = plan_->out_numel;
		return plan_->out_shape;
	}
	uint64_t numel() const {
		return numel_;
	}
	// z = the planned product of row r (numel() elements, C order).
	template <class T>
	void run(const EinsumArgs::Row &r, T *z, const char *fn) {
		check(control_of(budget_), fn);
		const T *x = aligned_view<T>(r.xb, xa_);
		const T *y = aligned_view<T>(r.yb, ya_);
		if (gemm_) {
			contract<T>(*c_, x, y, z, false, budget_, scratch_);
		} else {
			run_join_steps<T>(budget_, r.join, r.agg, *plan_, x, y, z, false, fn);
		}
	}
	// Scratch for an output that has no place of its own.
	template <class T>
	T *scratch() {
		return reinterpret_cast<T *>(zb_.resize(numel_ * sizeof(T)));
	}
	const unsigned char *scratch_data() const {
		return zb_.data();
	}

private:
	ThreadBudget *budget_;
	ContractionCache contractions_;
	PlanCache plans_;
	GemmScratch scratch_;
	AlignedBuf xa_, ya_, zb_;
	bool gemm_ = false;
	const Contraction *c_ = nullptr;
	const Plan *plan_ = nullptr;
	uint64_t numel_ = 0;
};

} // namespace

void tensor_einsum(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensor_einsum";
	guard_scalar(info, FN, [&] {
		EinsumArgs args(input);
		ThreadBudget *budget = budget_of(duckdb_scalar_function_get_extra_info(info));
		RowProduct product(budget, FN);
		CallCharge charged(memory_of(budget), FN);
		scalar_rows(input, output, all_valid(args), [&](idx_t row) {
			const EinsumArgs::Row r = args.read(row, FN);
			product.plan(args, r, FN);
			dispatch(r.dt, [&](auto tag) {
				using T = typename decltype(tag)::type;
				product.run<T>(r, product.scratch<T>(), FN);
			});
			charged.add(product.numel() * itemsize(r.dt), "the result blobs of a chunk");
			set_blob(output, row, product.scratch_data(), product.numel() * itemsize(r.dt));
		});
	});
}

// tensor_einsum_into(key, start, <tensor_einsum's arguments>) -> BIGINT: the block product written into a
// result sink at `start` (the elements written are returned). A block that is one contiguous run of the sink
// is computed in place there (the GEMM writes the caller's array directly); any other is formed in scratch
// and copied into place.
void tensor_einsum_into(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensor_einsum_into";
	guard_scalar(info, FN, [&] {
		SinkArgs sargs(input);
		EinsumArgs args(input, 2);
		RowProduct product(budget_of(duckdb_scalar_function_get_extra_info(info)), FN);
		int64_t *out = static_cast<int64_t *>(duckdb_vector_get_data(output));
		scalar_rows(input, output, all_valid(sargs, args), [&](idx_t row) {
			const Sink &sink = sargs.read(row, FN);
			const EinsumArgs::Row r = args.read(row, FN);
			const Shape &zs = product.plan(args, r, FN);
			const int64_t off = sink_block_offset(sink, r.dt, sargs.start, zs, FN);
			const bool direct = sink_block_contiguous(sink, zs);
			dispatch(r.dt, [&](auto tag) {
				using T = typename decltype(tag)::type;
				T *z = direct ? reinterpret_cast<T *>(sink.base) + off : product.scratch<T>();
				product.run<T>(r, z, FN);
				if (!direct) {
					sink_write<T>(sink, off, zs, {}, std::as_const(z));
				}
			});
			out[row] = static_cast<int64_t>(product.numel());
		});
	});
}

// ---- tensor_einsum_agg: tensor_<agg>(tensor_einsum(...)) fused into one aggregate ----

namespace {

struct EinsumAggState {
	static constexpr const char *kName = "tensor_einsum_agg";
	DType dtype = DType::F64;
	Agg agg = Agg::Sum;
	Shape out_shape;
	AlignedBuf buf;
	// No row has been added yet: buf is uninitialized. The first GEMM row overwrites it (beta = 0) instead of
	// adding to an identity-filled block; anything else fills the identity first (settle()).
	bool fresh = true;
	// Empty: buf is in Z's C order. Otherwise buf holds C in the GEMM layout of a pack_c contraction (Z's
	// interleaved labels grouped as [B, M, N]) and these loops (Z order, Loop::sx = stride in buf) map it to Z:
	// the rows of a group (typically one per K block) then accumulate with beta = 1 and Z is permuted once.
	std::vector<Loop> layout;
	// tensor_einsum_agg_into: the result sink and the block's start there (key 0: tensor_einsum_agg)
	int64_t sink_key = 0;
	Shape sink_start;
	void settle();
	void to_z(); // settle(), then permute buf into Z's order if it is in a GEMM layout
};

bool same_layout(const std::vector<Loop> &a, const std::vector<Loop> &b) {
	if (a.size() != b.size()) {
		return false;
	}
	for (size_t i = 0; i < a.size(); i++) {
		if (a[i].size != b[i].size || a[i].sx != b[i].sx) {
			return false;
		}
	}
	return true;
}

template <class T>
T agg_identity(Agg a) {
	return with_agg(a, [](auto tag) -> T {
		using A = decltype(tag);
		if constexpr (is_complex_v<T> && !A::kComplex) {
			return T(0); // never used: such a state is refused on its first row
		} else {
			return A::template identity<T>();
		}
	});
}

template <class T>
T *st_data(EinsumAggState *st) {
	return st->buf.template as<T>();
}

void EinsumAggState::settle() {
	if (!fresh) {
		return;
	}
	dispatch(dtype, [&](auto tag) {
		using T = typename decltype(tag)::type;
		T *p = buf.template as<T>();
		const T id = agg_identity<T>(agg);
		const size_t n = buf.size() / sizeof(T);
		for (size_t i = 0; i < n; i++) {
			p[i] = id;
		}
	});
	fresh = false;
}

void EinsumAggState::to_z() {
	settle();
	if (layout.empty()) {
		return;
	}
	AlignedBuf z = buf.sibling();
	z.resize(buf.size());
	dispatch(dtype, [&](auto tag) {
		using T = typename decltype(tag)::type;
		permute_into(layout.data(), layout.size(), std::as_const(buf).template as<T>(), z.template as<T>());
	});
	buf = std::move(z);
	layout.clear();
}

void combine_into(Agg agg, DType dt, unsigned char *acc, const unsigned char *src, uint64_t n, const char *fn) {
	with_agg(agg, [&](auto tag) { reduce_into<decltype(tag)>(dt, acc, src, n, fn); });
}

void check_state(const EinsumAggState &st, DType dt, Agg agg, const Shape &out, const char *fn) {
	check_same_dtype(fn, st.dtype, dt);
	if (st.agg != agg) {
		fail(std::string(fn) + ": agg changes within a group");
	}
	if (st.out_shape != out) {
		fail(std::string(fn) + ": output blocks in a group differ in shape (" + shape_str(st.out_shape) + " then " +
		     shape_str(out) + ")");
	}
}

// Contraction plans of one update call, kept at stable addresses (rows of one chunk refer to them until the
// deferred GEMMs have run). Usually one plan, a few at ragged edges; the last one used is checked first.
class ContractionStore {
public:
	const Contraction &get(const Spec &spec, const Shape &xs, const Shape &ys, DType dt, const char *fn) {
		const bool integer = is_integer_dtype(dt);
		const size_t isz = itemsize(dt);
		auto match = [&](const Entry &e) {
			return e.isz == isz && e.integer == integer && e.xs == xs && e.ys == ys && e.spec == spec.text;
		};
		if (last_ != nullptr && match(*last_)) {
			return last_->c;
		}
		for (auto &e : entries_) {
			if (match(*e)) {
				last_ = e.get();
				return e->c;
			}
		}
		auto e = std::make_unique<Entry>();
		e->c = plan_contraction(spec, xs, ys, isz, integer, fn);
		e->spec = spec.text;
		e->xs = xs;
		e->ys = ys;
		e->isz = isz;
		e->integer = integer;
		last_ = e.get();
		entries_.push_back(std::move(e));
		return last_->c;
	}

private:
	struct Entry {
		Contraction c;
		std::string spec;
		Shape xs, ys;
		size_t isz = 0;
		bool integer = false;
	};
	std::vector<std::unique_ptr<Entry>> entries_;
	Entry *last_ = nullptr;
};

// One deferred GEMM row of an update call: z(state) += contraction(x, y).
struct GemmRow {
	const Contraction *c;
	EinsumAggState *st;
	DType dt;
	Bytes xb, yb;
	bool shared = false; // the chunk has more GEMM rows for this state
};

// Packed copies (pgemm) of the float32 blocks one thread multiplies, valid for one run_gemm_rows call (the
// chunk's blobs stay put until it returns, so a blob's address identifies its block). A thread runs its rows
// sorted by X block, so X's copy serves a whole run of rows; Y blocks recur across runs and are kept up to
// kCapBytes (first come, first kept: the access pattern is cyclic, where LRU would keep nothing).
class PackCache {
public:
	static constexpr size_t kCapBytes = size_t(32) << 20;

	// The packed A (role_a) or B operand of contraction c, read from `blob` (the X operand's when is_x); an
	// unaligned blob is first copied into tmp, and only when it is not packed yet.
	const float *get(const Bytes &blob, const Contraction &c, bool role_a, bool is_x, AlignedBuf &tmp) {
		const size_t floats = role_a ? pgemm::packed_a_floats(c.m, c.k) : pgemm::packed_b_floats(c.k, c.n);
		auto same = [&](const Entry &e) { return e.key == blob.data && e.c == &c && e.role_a == role_a; };
		Entry *e = &x_;
		if (!is_x) {
			for (auto &y : ys_) {
				if (same(*y)) {
					return std::as_const(y->buf).template as<float>();
				}
			}
			e = &spill_;
			if (y_bytes_ + floats * sizeof(float) <= kCapBytes) {
				ys_.push_back(std::make_unique<Entry>());
				e = ys_.back().get();
				y_bytes_ += floats * sizeof(float);
			}
		}
		if (same(*e)) {
			return std::as_const(e->buf).template as<float>();
		}
		e->key = blob.data;
		e->c = &c;
		e->role_a = role_a;
		float *out = reinterpret_cast<float *>(e->buf.resize(floats * sizeof(float)));
		const float *data = aligned_view<float>(blob, tmp);
		if (role_a) {
			pgemm::pack_a(data, c.a.sr, c.a.sc, c.m, c.k, out);
		} else {
			pgemm::pack_b(data, c.b.sr, c.b.sc, c.k, c.n, out);
		}
		return out;
	}

private:
	struct Entry {
		const char *key = nullptr;
		const Contraction *c = nullptr;
		bool role_a = false;
		AlignedBuf buf;
	};
	Entry x_, spill_;
	std::vector<std::unique_ptr<Entry>> ys_;
	size_t y_bytes_ = 0;
};

// Whether a row's GEMM runs on packed copies: one float32 batch whose operands are read in place, C in Z's
// order, and small enough not to be split over threads (OpenBLAS's threaded path serves big ones).
bool packed_gemm(const GemmRow &w, const EinsumAggState &st, ThreadBudget *budget) {
	const Contraction &c = *w.c;
	if (w.dt != DType::F32 || c.nb != 1 || c.a.pack || c.b.pack || c.pack_c || c.tiled || !st.layout.empty()) {
		return false;
	}
	if (c.m < 16 || c.n < 16 || c.k < 16) {
		return false;
	}
	if (budget != nullptr && gemm_threads_wanted(c.flops, budget->total()) > 1) {
		return false;
	}
	return pgemm::supported();
}

void run_gemm_row(const GemmRow &w, ThreadBudget *budget, GemmScratch &scratch, AlignedBuf &xa, AlignedBuf &ya,
                  PackCache *packs = nullptr) {
	if (packs != nullptr && scratch.path == KernelPath::Avx512 && packed_gemm(w, *w.st, budget)) {
		const Contraction &c = *w.c;
		// A = X and B = Y, or A = Y^T and B = X^T (swap); the cache is keyed by blob so X's copy is reused
		const float *pa = c.swap ? packs->get(w.yb, c, true, false, ya) : packs->get(w.xb, c, true, true, xa);
		const float *pb = c.swap ? packs->get(w.xb, c, false, true, xa) : packs->get(w.yb, c, false, false, ya);
		EinsumAggState &st = *w.st;
		pgemm::gemm_packed(c.m, c.n, c.k, pa, pb, st_data<float>(&st), c.cr, !st.fresh);
		st.fresh = false;
		if (scratch.control != nullptr) {
			scratch.control->announce(c.flops);
			scratch.control->add(c.flops);
		}
		return;
	}
	dispatch(w.dt, [&](auto tag) {
		using T = typename decltype(tag)::type;
		const T *x = aligned_view<T>(w.xb, xa);
		const T *y = aligned_view<T>(w.yb, ya);
		EinsumAggState &st = *w.st;
		if (w.c->pack_c &&
		    ((st.fresh && w.shared) || (!st.layout.empty() && same_layout(st.layout, w.c->unpack)))) {
			// several products for this state: accumulate in the GEMM layout, permute to Z's order once
			// (finalize/combine) instead of scattering every product into Z
			if (st.fresh) {
				st.layout = w.c->unpack;
			}
			contract<T>(*w.c, x, y, st_data<T>(&st), !st.fresh, budget, scratch, true);
		} else {
			if (!st.fresh) { // a fresh state has no layout, and its first product overwrites it (beta = 0)
				st.to_z();
			}
			contract<T>(*w.c, x, y, st_data<T>(&st), !st.fresh, budget, scratch);
		}
		st.fresh = false;
	});
}

// Runs the chunk's GEMM rows. Rows of one group (state) run in row order on one thread; when the chunk has
// enough groups to balance over the threads the call may use, whole groups go to the budget's pool (each GEMM
// single-threaded, at full BLAS efficiency and without a hand-off per GEMM); otherwise the rows run here one
// after another and each large GEMM splits itself.
void run_gemm_rows(std::vector<GemmRow> &rows, ThreadBudget *budget) {
	if (rows.empty()) {
		return;
	}
	{
		std::vector<const EinsumAggState *> sts;
		sts.reserve(rows.size());
		for (const auto &w : rows) {
			sts.push_back(w.st);
		}
		std::sort(sts.begin(), sts.end(), std::less<const EinsumAggState *>());
		for (auto &w : rows) {
			const auto r = std::equal_range(sts.begin(), sts.end(), w.st, std::less<const EinsumAggState *>());
			w.shared = r.second - r.first > 1;
		}
	}
	double total = 0;
	for (const auto &w : rows) {
		total += w.c->flops * (is_complex_dtype(w.dt) ? 4.0 : 1.0);
	}
	// Tokens acquired here, released on every path (also when something below throws); got <= held threads
	// are used.
	struct Held {
		ThreadBudget *b = nullptr;
		int n = 0;
		void release() {
			if (b != nullptr && n > 0) {
				b->release(n);
			}
			n = 0;
		}
		~Held() {
			release();
		}
	} held;
	if (budget != nullptr && budget->total() > 1 && rows.size() > 1) {
		held.b = budget;
		held.n = budget->acquire(gemm_threads_wanted(total, budget->total()));
	}
	int got = held.n < 1 ? 1 : held.n;
	struct Group {
		size_t first, last; // [first, last) in rows, after the stable sort by state
		double flops;
	};
	std::vector<Group> groups;
	std::vector<std::vector<size_t>> bins;
	bool parallel = false;
	if (got > 1) {
		std::stable_sort(rows.begin(), rows.end(), [](const GemmRow &a, const GemmRow &b) {
			return std::less<const EinsumAggState *>()(a.st, b.st);
		});
		for (size_t i = 0; i < rows.size(); i++) {
			const double f = rows[i].c->flops * (is_complex_dtype(rows[i].dt) ? 4.0 : 1.0);
			if (groups.empty() || rows[groups.back().first].st != rows[i].st) {
				groups.push_back(Group {i, i + 1, f});
			} else {
				groups.back().last = i + 1;
				groups.back().flops += f;
			}
		}
		got = static_cast<int>(std::min<size_t>(static_cast<size_t>(got), groups.size()));
		if (got > 1) {
			// longest processing time first: each group to the least loaded bin
			std::vector<size_t> order(groups.size());
			for (size_t g = 0; g < order.size(); g++) {
				order[g] = g;
			}
			std::stable_sort(order.begin(), order.end(),
			                 [&](size_t a, size_t b) { return groups[a].flops > groups[b].flops; });
			bins.assign(static_cast<size_t>(got), {});
			std::vector<double> load(static_cast<size_t>(got), 0.0);
			for (size_t g : order) {
				const size_t k = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
				bins[k].push_back(g);
				load[k] += groups[g].flops;
			}
			const double worst = *std::max_element(load.begin(), load.end());
			parallel = worst <= 1.15 * total / got;
		}
	}
	if (!parallel) {
		held.release(); // each GEMM below takes its own tokens
		GemmScratch scratch(kernel_path_of(budget), memory_of(budget));
		scratch.control = control_of(budget);
		AlignedBuf xa(memory_of(budget), EinsumAggState::kName, "an aligned copy of operand x");
		AlignedBuf ya(memory_of(budget), EinsumAggState::kName, "an aligned copy of operand y");
		PackCache packs;
		for (const auto &w : rows) {
			check(scratch.control, EinsumAggState::kName);
			run_gemm_row(w, budget, scratch, xa, ya, &packs);
		}
		return;
	}
	std::vector<std::exception_ptr> errors(static_cast<size_t>(got));
	budget->run(got, [&](int t) {
		try {
			GemmScratch scratch(budget->path(), memory_of(budget));
			scratch.control = control_of(budget);
			AlignedBuf xa(memory_of(budget), EinsumAggState::kName, "an aligned copy of operand x");
			AlignedBuf ya(memory_of(budget), EinsumAggState::kName, "an aligned copy of operand y");
			// This thread owns whole groups, so their rows may run in any order: rows that share an X block
			// (one block of A times a row of B blocks) run back to back, and BLAS packs that block from
			// cache instead of memory each time
			std::vector<size_t> order;
			for (size_t g : bins[static_cast<size_t>(t)]) {
				for (size_t i = groups[g].first; i < groups[g].last; i++) {
					order.push_back(i);
				}
			}
			std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
				const std::less<const void *> lt;
				const void *xa_ = rows[a].xb.data, *xb_ = rows[b].xb.data;
				return lt(xa_, xb_) || (xa_ == xb_ && lt(rows[a].yb.data, rows[b].yb.data));
			});
			PackCache packs;
			for (size_t i : order) {
				check(scratch.control, EinsumAggState::kName);
				run_gemm_row(rows[i], nullptr, scratch, xa, ya, &packs);
			}
		} catch (...) {
			errors[static_cast<size_t>(t)] = std::current_exception();
		}
	});
	for (const auto &e : errors) {
		if (e) {
			std::rethrow_exception(e);
		}
	}
}

constexpr const char *kAggInto = "tensor_einsum_agg_into";

// The update of tensor_einsum_agg, and of tensor_einsum_agg_into (into: a sink key and a start come first).
void agg_update(duckdb_function_info info, duckdb_data_chunk input, duckdb_aggregate_state *states, bool into) {
	const char *FN = into ? kAggInto : EinsumAggState::kName;
	guard_aggregate(info, FN, [&] {
		ThreadBudget *budget = budget_of(duckdb_aggregate_function_get_extra_info(info));
		std::unique_ptr<SinkArgs> sargs;
		if (into) {
			sargs = std::make_unique<SinkArgs>(input);
		}
		EinsumArgs args(input, into ? 2 : 0);
		ContractionStore contractions;
		PlanCache plans;
		AlignedBuf xa(memory_of(budget), FN, "an aligned copy of operand x");
		AlignedBuf ya(memory_of(budget), FN, "an aligned copy of operand y");
		std::vector<GemmRow> gemm_rows;
		auto valid = [&](idx_t row) { return args.valid(row) && (!into || sargs->valid(row)); };
		update_rows(input, valid, [&](idx_t row) {
			check(control_of(budget), FN);
			if (into) {
				sargs->read(row, FN);
			}
			const EinsumArgs::Row r = args.read(row, FN);
			const bool gemm = r.join == Join::Mul && r.agg == Agg::Sum && gemm_dtype(r.dt);
			const Contraction *c = nullptr;
			const Plan *plan = nullptr;
			const Shape *out_shape;
			uint64_t out_numel;
			if (gemm) {
				c = &contractions.get(*r.spec, args.xs(), args.ys(), r.dt, FN);
				out_shape = &c->out_shape;
				out_numel = c->out_numel;
			} else {
				plan = &plans.get(*r.spec, args.xs(), args.ys(), r.dt, FN);
				check_empty_reduction(*plan, r.agg, r.dt, FN);
				out_shape = &plan->out_shape;
				out_numel = plan->out_numel;
			}
			EinsumAggState *&st = slot<EinsumAggState>(states[row]);
			dispatch(r.dt, [&](auto tag) {
				using T = typename decltype(tag)::type;
				if (st == nullptr) {
					if constexpr (is_complex_v<T>) {
						if (!agg_complex(r.agg)) {
							not_for_complex(FN, "agg", agg_name(r.agg), name_of<T>());
						}
					}
					auto fresh = std::make_unique<EinsumAggState>();
					fresh->dtype = r.dt;
					fresh->agg = r.agg;
					fresh->out_shape = *out_shape;
					fresh->buf.charge_to(memory_of(budget), FN, "a group's output block");
					fresh->buf.resize(out_numel * sizeof(T)); // filled by the first row (see fresh)
					if (into) {
						fresh->sink_key = sargs->key;
						fresh->sink_start = sargs->start;
					}
					st = fresh.release();
				} else {
					check_state(*st, r.dt, r.agg, *out_shape, FN);
					if (into && (st->sink_key != sargs->key || st->sink_start != sargs->start)) {
						fail(std::string(FN) + ": rows of one group name different sink blocks (start " +
						     shape_str(st->sink_start) + " then " + shape_str(sargs->start) + ")");
					}
				}
				if (gemm) {
					// deferred: the GEMM rows of the chunk run together below (possibly in parallel)
					gemm_rows.push_back(GemmRow {c, st, r.dt, r.xb, r.yb});
				} else {
					st->to_z();
					const T *x = aligned_view<T>(r.xb, xa);
					const T *y = aligned_view<T>(r.yb, ya);
					run_join_steps<T>(budget, r.join, r.agg, *plan, x, y, st->buf.template as<T>(), true,
					                  FN);
				}
			});
		});
		run_gemm_rows(gemm_rows, budget);
	});
}

void einsum_agg_update(duckdb_function_info info, duckdb_data_chunk input, duckdb_aggregate_state *states) {
	agg_update(info, input, states, false);
}

void einsum_agg_into_update(duckdb_function_info info, duckdb_data_chunk input, duckdb_aggregate_state *states) {
	agg_update(info, input, states, true);
}

void einsum_agg_combine(duckdb_function_info info, duckdb_aggregate_state *source, duckdb_aggregate_state *target,
                        idx_t count) {
	static constexpr const char *FN = EinsumAggState::kName;
	guard_aggregate(info, FN, [&] {
		for (idx_t i = 0; i < count; i++) {
			const EinsumAggState *src = slot<EinsumAggState>(source[i]);
			if (src == nullptr) {
				continue;
			}
			EinsumAggState *&tgt = slot<EinsumAggState>(target[i]);
			if (tgt == nullptr) {
				tgt = new EinsumAggState(*src);
				tgt->settle();
				continue;
			}
			tgt->settle();
			if (src->fresh) { // no row completed (an update failed): contributes nothing
				continue;
			}
			check_state(*tgt, src->dtype, src->agg, src->out_shape, FN);
			const EinsumAggState *from = src;
			std::unique_ptr<EinsumAggState> converted;
			if (!same_layout(tgt->layout, src->layout)) { // both to Z's order
				tgt->to_z();
				if (!src->layout.empty()) {
					converted = std::make_unique<EinsumAggState>(*src);
					converted->to_z();
					from = converted.get();
				}
			}
			combine_into(tgt->agg, tgt->dtype, tgt->buf.data(), from->buf.data(),
			             from->buf.size() / itemsize(from->dtype), FN);
		}
	});
}

void einsum_agg_finalize(duckdb_function_info info, duckdb_aggregate_state *source, duckdb_vector result,
                         idx_t count, idx_t offset) {
	guard_aggregate(info, EinsumAggState::kName, [&] {
		for (idx_t i = 0; i < count; i++) {
			if (EinsumAggState *st = slot<EinsumAggState>(source[i])) {
				st->to_z();
			}
		}
	});
	state_finalize<EinsumAggState>(info, source, result, count, offset);
}

// Each group's block goes straight from its state into the sink (permuted there from a GEMM layout), not
// through a DuckDB blob; the result is the number of elements written.
void einsum_agg_into_finalize(duckdb_function_info info, duckdb_aggregate_state *source, duckdb_vector result,
                              idx_t count, idx_t offset) {
	guard_aggregate(info, kAggInto, [&] {
		int64_t *out = static_cast<int64_t *>(duckdb_vector_get_data(result));
		Sink sink;
		int64_t key = 0;
		for (idx_t i = 0; i < count; i++) {
			EinsumAggState *st = slot<EinsumAggState>(source[i]);
			if (st == nullptr) {
				set_null(result, offset + i);
				continue;
			}
			st->settle();
			if (sink.base == nullptr || st->sink_key != key) {
				sink = sink_find(st->sink_key, kAggInto);
				key = st->sink_key;
			}
			const int64_t off = sink_block_offset(sink, st->dtype, st->sink_start, st->out_shape, kAggInto);
			dispatch(st->dtype, [&](auto tag) {
				using T = typename decltype(tag)::type;
				sink_write<T>(sink, off, st->out_shape, st->layout, std::as_const(st->buf).template as<T>());
			});
			out[offset + i] = static_cast<int64_t>(st->buf.size() / itemsize(st->dtype));
		}
	});
}


} // namespace

ThreadBudget *budget_of(void *extra) {
	return extra == nullptr ? nullptr : static_cast<BudgetPtr *>(extra)->get();
}

MemoryBudget *memory_of_info(void *extra) {
	return memory_of(budget_of(extra));
}

namespace {

void delete_budget(void *p) {
	delete static_cast<BudgetPtr *>(p);
}

} // namespace

void attach_budget(duckdb_scalar_function f, const BudgetPtr &budget) {
	duckdb_scalar_function_set_extra_info(f, new BudgetPtr(budget), delete_budget);
}

void attach_budget(duckdb_aggregate_function a, const BudgetPtr &budget) {
	duckdb_aggregate_function_set_extra_info(a, new BudgetPtr(budget), delete_budget);
}

bool register_budgeted_aggregate(duckdb_connection con, const AggDef &def, const BudgetPtr &budget) {
	duckdb_aggregate_function a = make_aggregate(def);
	attach_budget(a, budget);
	const bool ok = duckdb_register_aggregate_function(con, a) == DuckDBSuccess;
	duckdb_destroy_aggregate_function(&a);
	return ok;
}

bool add_budgeted_scalar(duckdb_connection con, const char *name, std::initializer_list<Ty> params, Ty ret,
                         duckdb_scalar_function_t fn, const BudgetPtr &budget, bool side_effects,
                         bool blob_varargs) {
	duckdb_scalar_function f = duckdb_create_scalar_function();
	duckdb_scalar_function_set_name(f, name);
	for (Ty t : params) {
		TypeHandle h(t);
		duckdb_scalar_function_add_parameter(f, h.get());
	}
	if (blob_varargs) {
		TypeHandle blob(Ty::Blob);
		duckdb_scalar_function_set_varargs(f, blob.get());
	}
	TypeHandle r(ret);
	duckdb_scalar_function_set_return_type(f, r.get());
	duckdb_scalar_function_set_function(f, fn);
	if (side_effects) {
		duckdb_scalar_function_set_volatile(f);
	}
	attach_budget(f, budget);
	const bool ok = duckdb_register_scalar_function(con, f) == DuckDBSuccess;
	duckdb_destroy_scalar_function(&f);
	return ok;
}

bool register_einsum_functions(duckdb_connection con, const BudgetPtr &budget) {
	using T = Ty;
	const T B = T::Blob, V = T::Varchar, L = T::ListBigInt, I = T::BigInt;
	// the result-sink variants take (key BIGINT, start BIGINT[], <the same arguments>) and return BIGINT
	return add_budgeted_scalar(con, "tensorsql_gemm_plan", {V, V, L, L}, V, tensorsql_gemm_plan, budget, false) &&
	       add_budgeted_scalar(con, "tensor_einsum", {V, V, V, V, B, L, B, L}, B, tensor_einsum, budget, true) &&
	       add_budgeted_scalar(con, "tensor_einsum_into", {I, L, V, V, V, V, B, L, B, L}, I, tensor_einsum_into,
	                           budget, true) &&
	       register_budgeted_aggregate(con,
	                              AggDef {EinsumAggState::kName,
	                                      {V, V, V, V, B, L, B, L},
	                                      state_init<EinsumAggState>,
	                                      einsum_agg_update,
	                                      einsum_agg_combine,
	                                      einsum_agg_finalize,
	                                      state_destroy<EinsumAggState>},
	                              budget) &&
	       register_budgeted_aggregate(con,
	                              AggDef {kAggInto,
	                                      {I, L, V, V, V, V, B, L, B, L},
	                                      state_init<EinsumAggState>,
	                                      einsum_agg_into_update,
	                                      einsum_agg_combine,
	                                      einsum_agg_into_finalize,
	                                      state_destroy<EinsumAggState>,
	                                      I},
	                              budget);
}

// tensorsql_gemm_plan(spec, dtype, x_shape, y_shape) -> VARCHAR: how a multiply/sum product of blocks of these
// shapes maps onto GEMM calls (batches, m x n x k per batch, which operands are packed, whether C is formed aside
// or in tiles), for tests and for reading a plan's kernels; computes nothing.
void tensorsql_gemm_plan(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensorsql_gemm_plan";
	guard_scalar(info, FN, [&] {
		Col spec_c(input, 0);
		DTypeCol dtype_c(input, 1);
		ListCol xs_c(input, 2), ys_c(input, 3);
		Shape xs, ys;
		scalar_rows(input, output, all_valid(spec_c, dtype_c, xs_c, ys_c), [&](idx_t row) {
			const Spec spec = parse_spec(spec_c.str(row), 2, FN);
			const DType dt = dtype_c.get(row, FN);
			xs_c.get(row, xs, FN, "x_shape");
			ys_c.get(row, ys, FN, "y_shape");
			const Contraction c = plan_contraction(spec, xs, ys, itemsize(dt), is_integer_dtype(dt), FN);
			const std::string text = "nb=" + std::to_string(c.nb) + " m=" + std::to_string(c.m) +
			                         " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
			                         " pack_a=" + std::to_string(c.a.pack ? 1 : 0) +
			                         " pack_b=" + std::to_string(c.b.pack ? 1 : 0) +
			                         " pack_c=" + std::to_string(c.pack_c ? 1 : 0) +
			                         " tiled=" + std::to_string(c.tiled ? 1 : 0) +
			                         " swap=" + std::to_string(c.swap ? 1 : 0);
			duckdb_vector_assign_string_element_len(output, row, text.data(), text.size());
		});
	});
}

void tensor_einsum1(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensor_einsum1";
	guard_scalar(info, FN, [&] {
		Col spec_c(input, 0), agg_c(input, 1);
		DTypeCol dtype_c(input, 2);
		BlockCol x(input, 3, 4, "x");
		Cached<Spec> specs;
		Cached<Agg> aggs;
		void *extra = duckdb_scalar_function_get_extra_info(info);
		MemoryBudget *mem = memory_of_info(extra);
		AlignedBuf xa(mem, FN, "an aligned copy of operand x"), zb(mem, FN, "the output block");
		CallCharge charged(mem, FN);
		static const char *const names[] = {"x", "y"};
		scalar_rows(input, output, all_valid(spec_c, agg_c, dtype_c, x), [&](idx_t row) {
			const Spec &spec = specs.get(spec_c.str(row), [](const Bytes &b) { return parse_spec(b, 1, FN); });
			const Agg agg = aggs.get(agg_c.str(row), [](const Bytes &b) { return parse_agg(b, FN); });
			const DType dt = dtype_c.get(row, FN);
			x.read(row, dt, FN);
			const Shape *shapes[] = {&x.shape, nullptr};
			const Plan plan = make_plan(spec, shapes, names, itemsize(dt), FN);
			check_empty_reduction(plan, agg, dt, FN);
			const size_t out_bytes = plan.out_numel * itemsize(dt);
			dispatch(dt, [&](auto tag) {
				using T = typename decltype(tag)::type;
				const T *xp = aligned_view<T>(x.bytes, xa);
				T *z = reinterpret_cast<T *>(zb.resize(out_bytes));
				run_unary<T>(budget_of(extra), agg, plan, xp, z, FN);
			});
			charged.add(out_bytes, "the result blobs of a chunk");
			set_blob(output, row, zb.data(), out_bytes);
		});
	});
}

} // namespace tsk
