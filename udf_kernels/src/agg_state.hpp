// Aggregate-state plumbing shared by the native aggregates (aggregates.cpp, einsum.cpp): each group's state
// is one pointer to a heap object created on the first non-NULL row (an empty group finalizes to NULL).
#pragma once

#include "dtype.hpp"
#include "functions.hpp"
#include "ops.hpp"

namespace tsk {

template <class S>
S *&slot(duckdb_aggregate_state s) {
	return *reinterpret_cast<S **>(s);
}

inline idx_t state_size(duckdb_function_info) {
	return sizeof(void *);
}

template <class S>
void state_init(duckdb_function_info, duckdb_aggregate_state s) {
	slot<S>(s) = nullptr;
}

template <class S>
void state_destroy(duckdb_aggregate_state *states, idx_t count) {
	for (idx_t i = 0; i < count; i++) {
		delete slot<S>(states[i]);
		slot<S>(states[i]) = nullptr;
	}
}

template <class S>
void state_finalize(duckdb_function_info info, duckdb_aggregate_state *source, duckdb_vector result, idx_t count,
                    idx_t offset) {
	guard_aggregate(info, S::kName, [&] {
		CallCharge charged(memory_of_info(duckdb_aggregate_function_get_extra_info(info)), S::kName);
		for (idx_t i = 0; i < count; i++) {
			const S *st = slot<S>(source[i]);
			if (st == nullptr) {
				set_null(result, offset + i);
			} else {
				charged.add(st->buf.size(), "the result blobs of a chunk");
				set_blob(result, offset + i, st->buf.data(), st->buf.size());
			}
		}
	});
}

// acc[i] = A::f(acc[i], src[i]) for n elements of dtype dt.
template <class A>
inline void reduce_into(DType dt, unsigned char *acc, const unsigned char *src, uint64_t n, const char *fn) {
	dispatch(dt, [&](auto tag) {
		using T = typename decltype(tag)::type;
		if constexpr (is_complex_v<T> && !A::kComplex) {
			fail(std::string(fn) + ": not defined for complex (dtype " + name_of<T>() + ")");
		} else {
			for (uint64_t i = 0; i < n; i++) {
				unsigned char *p = acc + i * sizeof(T);
				store<T>(p, A::f(load<T>(p), load<T>(src + i * sizeof(T))));
			}
		}
	});
}

inline void check_same_dtype(const char *fn, DType state, DType row) {
	if (state != row) {
		fail(std::string(fn) + ": dtype changes within a group (" + dtype_name(state) + " then " + dtype_name(row) +
		     ")");
	}
}

// ---- registration ----

struct AggDef {
	const char *name;
	std::vector<Ty> params;
	duckdb_aggregate_init_t init;
	duckdb_aggregate_update_t update;
	duckdb_aggregate_combine_t combine;
	duckdb_aggregate_finalize_t finalize;
	duckdb_aggregate_destroy_t destroy;
	Ty ret = Ty::Blob;
};

inline duckdb_aggregate_function make_aggregate(const AggDef &d) {
	duckdb_aggregate_function f = duckdb_create_aggregate_function();
	duckdb_aggregate_function_set_name(f, d.name);
	for (Ty t : d.params) {
		TypeHandle h(t);
		duckdb_aggregate_function_add_parameter(f, h.get());
	}
	TypeHandle ret(d.ret);
	duckdb_aggregate_function_set_return_type(f, ret.get());
	duckdb_aggregate_function_set_functions(f, state_size, d.init, d.update, d.combine, d.finalize);
	duckdb_aggregate_function_set_destructor(f, d.destroy);
	return f;
}

// Registers the aggregate with the budget as its extra info (einsum.cpp).
bool register_budgeted_aggregate(duckdb_connection con, const AggDef &def, const std::shared_ptr<ThreadBudget> &budget);

} // namespace tsk
