// Native aggregate functions: tensor_sum/max/min/prod (elementwise reduction of equal-sized blocks),
// tensor_assemble (place pieces inside an output block) and tensor_pack (build a block from scalar rows).
//
// DuckDB gives each group a state of state_size() bytes; ours holds one pointer to a heap object, created on
// the first non-NULL row (so an empty group finalizes to NULL) and freed by the destroy callback. combine()
// merges thread-local states into a target and never modifies or steals the source (window aggregation may
// reuse it).
#include "dtype.hpp"
#include "functions.hpp"
#include "ops.hpp"
#include "agg_state.hpp"
#include "rows.hpp"

#include <memory>

namespace tsk {
namespace {

// ---- tensor_sum / tensor_max / tensor_min / tensor_prod ----

template <class A>
struct ReduceState {
	static constexpr const char *kName = A::kSql; // tensor_sum, tensor_max, ...
	DType dtype;
	AlignedBuf buf;
};

template <class A>
void check_reducible(const char *fn, DType dt) {
	if (!A::kComplex && is_complex_dtype(dt)) {
		fail(std::string(fn) + ": not defined for complex (dtype " + dtype_name(dt) + ")");
	}
}

template <class A>
void reduce_update(duckdb_function_info info, duckdb_data_chunk input, duckdb_aggregate_state *states) {
	using S = ReduceState<A>;
	const char *FN = S::kName;
	guard_aggregate(info, FN, [&] {
		MemoryBudget *mem = memory_of_info(duckdb_aggregate_function_get_extra_info(info));
		BlobCol x(input, 0);
		DTypeCol dtype_c(input, 1);
		update_rows(input, all_valid(x, dtype_c), [&](idx_t row) {
			const DType dt = dtype_c.get(row, FN);
			const uint64_t n = x.read(row, dt, FN);
			const Bytes &xb = x.bytes;
			S *&st = slot<S>(states[row]);
			if (st == nullptr) {
				check_reducible<A>(FN, dt);
				auto fresh = std::make_unique<S>();
				fresh->dtype = dt;
				fresh->buf.charge_to(mem, FN, "a group's block");
				unsigned char *p = fresh->buf.resize(xb.size);
				if (xb.size) {
					std::memcpy(p, xb.data, xb.size);
				}
				st = fresh.release();
				return;
			}
			check_same_dtype(FN, st->dtype, dt);
			if (st->buf.size() != xb.size) {
				fail(std::string(FN) + ": blocks in a group differ in size (" + std::to_string(st->buf.size()) +
				     " bytes, then " + std::to_string(xb.size) + " bytes)");
			}
			reduce_into<A>(dt, st->buf.data(), xb.udata(), n, FN);
		});
	});
}

template <class A>
void reduce_combine(duckdb_function_info info, duckdb_aggregate_state *source, duckdb_aggregate_state *target,
                    idx_t count) {
	using S = ReduceState<A>;
	const char *FN = S::kName;
	guard_aggregate(info, FN, [&] {
		for (idx_t i = 0; i < count; i++) {
			const S *src = slot<S>(source[i]);
			if (src == nullptr) {
				continue;
			}
			S *&tgt = slot<S>(target[i]);
			if (tgt == nullptr) {
				tgt = new S(*src);
				continue;
			}
			check_same_dtype(FN, tgt->dtype, src->dtype);
			if (tgt->buf.size() != src->buf.size()) {
				fail(std::string(FN) + ": blocks in a group differ in size (" + std::to_string(tgt->buf.size()) +
				     " bytes vs " + std::to_string(src->buf.size()) + " bytes)");
			}
			reduce_into<A>(tgt->dtype, tgt->buf.data(), src->buf.data(), src->buf.size() / itemsize(src->dtype), FN);
		}
	});
}

// ---- tensor_assemble(dtype, x, x_shape, offset, out_shape) ----

struct AssembleState {
	static constexpr const char *kName = "tensor_assemble";
	DType dtype = DType::F64;
	Shape out_shape;
	AlignedBuf buf;
	// Pieces written so far, each as rank offsets followed by rank extents (used by combine).
	std::vector<int64_t> pieces;
	size_t n_pieces = 0;
};

void assemble_update(duckdb_function_info info, duckdb_data_chunk input, duckdb_aggregate_state *states) {
	static constexpr const char *FN = AssembleState::kName;
	guard_aggregate(info, FN, [&] {
		MemoryBudget *mem = memory_of_info(duckdb_aggregate_function_get_extra_info(info));
		DTypeCol dtype_c(input, 0);
		BlockCol x(input, 1, 2, "x");
		ListCol off_c(input, 3), outs_c(input, 4);
		Shape off, outs, zero;
		update_rows(input, all_valid(dtype_c, x, off_c, outs_c), [&](idx_t row) {
			const DType dt = dtype_c.get(row, FN);
			x.read(row, dt, FN);
			const Shape &xs = x.shape;
			off_c.get(row, off, FN, "offset");
			outs_c.get(row, outs, FN, "out_shape");
			const uint64_t out_numel = checked_numel(outs, itemsize(dt), FN, "out_shape");
			if (xs.size() != outs.size() || off.size() != outs.size()) {
				fail(std::string(FN) + ": x_shape " + shape_str(xs) + ", offset " + shape_str(off) +
				     " and out_shape " + shape_str(outs) + " must have the same rank");
			}
			for (size_t k = 0; k < outs.size(); k++) {
				if (off[k] < 0 || off[k] > outs[k] - xs[k]) {
					fail(std::string(FN) + ": piece of shape " + shape_str(xs) + " at offset " + shape_str(off) +
					     " does not fit in out_shape " + shape_str(outs) + " (dim " + std::to_string(k) + ")");
				}
			}
			AssembleState *&st = slot<AssembleState>(states[row]);
			if (st == nullptr) {
				auto fresh = std::make_unique<AssembleState>();
				fresh->dtype = dt;
				fresh->out_shape = outs;
				fresh->buf.charge_to(mem, FN, "an assembled block").zeros(out_numel * itemsize(dt));
				st = fresh.release();
			} else {
				check_same_dtype(FN, st->dtype, dt);
				if (st->out_shape != outs) {
					fail(std::string(FN) + ": out_shape changes within a group (" + shape_str(st->out_shape) +
					     " then " + shape_str(outs) + ")");
				}
			}
			zero.assign(xs.size(), 0);
			copy_region(st->buf.data(), outs, off, x.bytes.udata(), xs, zero, xs, itemsize(dt));
			st->pieces.insert(st->pieces.end(), off.begin(), off.end());
			st->pieces.insert(st->pieces.end(), xs.begin(), xs.end());
			st->n_pieces++;
		});
	});
}

void assemble_combine(duckdb_function_info info, duckdb_aggregate_state *source, duckdb_aggregate_state *target,
                      idx_t count) {
	static constexpr const char *FN = AssembleState::kName;
	guard_aggregate(info, FN, [&] {
		Shape off, ext;
		for (idx_t i = 0; i < count; i++) {
			const AssembleState *src = slot<AssembleState>(source[i]);
			if (src == nullptr) {
				continue;
			}
			AssembleState *&tgt = slot<AssembleState>(target[i]);
			if (tgt == nullptr) {
				tgt = new AssembleState(*src);
				continue;
			}
			check_same_dtype(FN, tgt->dtype, src->dtype);
			if (tgt->out_shape != src->out_shape) {
				fail(std::string(FN) + ": out_shape differs within a group (" + shape_str(tgt->out_shape) + " vs " +
				     shape_str(src->out_shape) + ")");
			}
			const size_t r = src->out_shape.size();
			const size_t per_piece = 2 * r;
			for (size_t p = 0; p < src->n_pieces; p++) {
				const int64_t *rec = src->pieces.data() + p * per_piece;
				off.assign(rec, rec + r);
				ext.assign(rec + r, rec + per_piece);
				copy_region(tgt->buf.data(), tgt->out_shape, off, src->buf.data(), src->out_shape, off, ext,
				            itemsize(src->dtype));
			}
			tgt->pieces.insert(tgt->pieces.end(), src->pieces.begin(), src->pieces.end());
			tgt->n_pieces += src->n_pieces;
		}
	});
}

// ---- tensor_pack(dtype, idx, value, numel) ----

struct PackState {
	static constexpr const char *kName = "tensor_pack";
	DType dtype = DType::F64;
	int64_t numel = 0;
	AlignedBuf buf;
};

template <class V>
void pack_update(duckdb_function_info info, duckdb_data_chunk input, duckdb_aggregate_state *states) {
	static constexpr const char *FN = PackState::kName;
	guard_aggregate(info, FN, [&] {
		MemoryBudget *mem = memory_of_info(duckdb_aggregate_function_get_extra_info(info));
		DTypeCol dtype_c(input, 0);
		Col idx_c(input, 1), val_c(input, 2), numel_c(input, 3);
		const V *values = static_cast<const V *>(duckdb_vector_get_data(duckdb_data_chunk_get_vector(input, 2)));
		update_rows(input, all_valid(dtype_c, idx_c, val_c, numel_c), [&](idx_t row) {
			const DType dt = dtype_c.get(row, FN);
			const int64_t numel = numel_c.i64(row);
			const int64_t idx = idx_c.i64(row);
			checked_numel(Shape {numel}, itemsize(dt), FN, "numel");
			PackState *&st = slot<PackState>(states[row]);
			if (st == nullptr) {
				auto fresh = std::make_unique<PackState>();
				fresh->dtype = dt;
				fresh->numel = numel;
				fresh->buf.charge_to(mem, FN, "a packed block").zeros(static_cast<size_t>(numel) * itemsize(dt));
				st = fresh.release();
			} else {
				check_same_dtype(FN, st->dtype, dt);
				if (st->numel != numel) {
					fail(std::string(FN) + ": numel changes within a group (" + std::to_string(st->numel) + " then " +
					     std::to_string(numel) + ")");
				}
			}
			if (idx < 0 || idx >= numel) {
				fail(std::string(FN) + ": idx " + std::to_string(idx) + " is out of range [0, " + std::to_string(numel) +
				     ")");
			}
			const V v = values[row];
			dispatch(dt, [&](auto tag) {
				using T = typename decltype(tag)::type;
				unsigned char *p = st->buf.data() + static_cast<size_t>(idx) * sizeof(T);
				store<T>(p, wadd(load<T>(p), convert<T>(v)));
			});
		});
	});
}

void pack_combine(duckdb_function_info info, duckdb_aggregate_state *source, duckdb_aggregate_state *target,
                  idx_t count) {
	static constexpr const char *FN = PackState::kName;
	guard_aggregate(info, FN, [&] {
		for (idx_t i = 0; i < count; i++) {
			const PackState *src = slot<PackState>(source[i]);
			if (src == nullptr) {
				continue;
			}
			PackState *&tgt = slot<PackState>(target[i]);
			if (tgt == nullptr) {
				tgt = new PackState(*src);
				continue;
			}
			check_same_dtype(FN, tgt->dtype, src->dtype);
			if (tgt->numel != src->numel) {
				fail(std::string(FN) + ": numel differs within a group (" + std::to_string(tgt->numel) + " vs " +
				     std::to_string(src->numel) + ")");
			}
			reduce_into<ASum>(tgt->dtype, tgt->buf.data(), src->buf.data(), static_cast<uint64_t>(src->numel), FN);
		}
	});
}

template <class A>
AggDef reduce_def() {
	using S = ReduceState<A>;
	return AggDef {S::kName,         {Ty::Blob, Ty::Varchar}, state_init<S>,   reduce_update<A>,
	               reduce_combine<A>, state_finalize<S>,       state_destroy<S>};
}

} // namespace

bool register_aggregates(duckdb_connection con, const std::shared_ptr<ThreadBudget> &budget) {
	auto register_one = [&](const AggDef &d) { return register_budgeted_aggregate(con, d, budget); };
	// tensor_sum, tensor_max, ...: one block aggregate per aggregation of the operator table (ops.hpp)
	bool ok = all_aggs([&](auto tag) { return register_one(reduce_def<decltype(tag)>()); });
	ok = ok && register_one(AggDef {"tensor_assemble",
	                                     {Ty::Varchar, Ty::Blob, Ty::ListBigInt, Ty::ListBigInt, Ty::ListBigInt},
	                                     state_init<AssembleState>,
	                                     assemble_update,
	                                     assemble_combine,
	                                     state_finalize<AssembleState>,
	                                     state_destroy<AssembleState>});
	if (!ok) {
		return false;
	}
	duckdb_aggregate_function_set set = duckdb_create_aggregate_function_set("tensor_pack");
	duckdb_aggregate_function pd =
	    make_aggregate(AggDef {"tensor_pack", {Ty::Varchar, Ty::BigInt, Ty::Double, Ty::BigInt},
	                           state_init<PackState>, pack_update<double>, pack_combine,
	                           state_finalize<PackState>, state_destroy<PackState>});
	duckdb_aggregate_function pi =
	    make_aggregate(AggDef {"tensor_pack", {Ty::Varchar, Ty::BigInt, Ty::BigInt, Ty::BigInt},
	                           state_init<PackState>, pack_update<int64_t>, pack_combine,
	                           state_finalize<PackState>, state_destroy<PackState>});
	// UBIGINT values: a uint64 tensor's values above 2**63 convert exactly (not through DOUBLE)
	duckdb_aggregate_function pu =
	    make_aggregate(AggDef {"tensor_pack", {Ty::Varchar, Ty::BigInt, Ty::UBigInt, Ty::BigInt},
	                           state_init<PackState>, pack_update<uint64_t>, pack_combine,
	                           state_finalize<PackState>, state_destroy<PackState>});
	attach_budget(pd, budget);
	attach_budget(pi, budget);
	attach_budget(pu, budget);
	ok = duckdb_add_aggregate_function_to_set(set, pd) == DuckDBSuccess &&
	     duckdb_add_aggregate_function_to_set(set, pi) == DuckDBSuccess &&
	     duckdb_add_aggregate_function_to_set(set, pu) == DuckDBSuccess &&
	     duckdb_register_aggregate_function_set(con, set) == DuckDBSuccess;
	duckdb_destroy_aggregate_function(&pd);
	duckdb_destroy_aggregate_function(&pi);
	duckdb_destroy_aggregate_function(&pu);
	duckdb_destroy_aggregate_function_set(&set);
	return ok;
}

} // namespace tsk
