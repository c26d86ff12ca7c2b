// Extension entry point: registers every SQL function of tensorsql_kernels on the loading connection.
#define DUCKDB_EXTENSION_NAME tensorsql_kernels
#include "functions.hpp"
#include "gemm.hpp"
#include "kernel_path.hpp"
#include "sink.hpp"

#include <cstdlib>
#include <thread>

#include <initializer_list>

// The API struct global (duckdb_ext_api) is defined by DUCKDB_EXTENSION_ENTRYPOINT at the end of this file.

namespace tsk {

TypeHandle::TypeHandle(Ty t) {
	switch (t) {
	case Ty::Varchar:
		type_ = duckdb_create_logical_type(DUCKDB_TYPE_VARCHAR);
		return;
	case Ty::Blob:
		type_ = duckdb_create_logical_type(DUCKDB_TYPE_BLOB);
		return;
	case Ty::BigInt:
		type_ = duckdb_create_logical_type(DUCKDB_TYPE_BIGINT);
		return;
	case Ty::UBigInt:
		type_ = duckdb_create_logical_type(DUCKDB_TYPE_UBIGINT);
		return;
	case Ty::Integer:
		type_ = duckdb_create_logical_type(DUCKDB_TYPE_INTEGER);
		return;
	case Ty::Double:
		type_ = duckdb_create_logical_type(DUCKDB_TYPE_DOUBLE);
		return;
	case Ty::Boolean:
		type_ = duckdb_create_logical_type(DUCKDB_TYPE_BOOLEAN);
		return;
	case Ty::ListBigInt:
	case Ty::ListUBigInt:
	case Ty::ListDouble: {
		duckdb_logical_type child = duckdb_create_logical_type(
		    t == Ty::ListBigInt ? DUCKDB_TYPE_BIGINT : t == Ty::ListUBigInt ? DUCKDB_TYPE_UBIGINT : DUCKDB_TYPE_DOUBLE);
		type_ = duckdb_create_list_type(child);
		duckdb_destroy_logical_type(&child);
		return;
	}
	}
	type_ = duckdb_create_logical_type(DUCKDB_TYPE_BLOB);
}

TypeHandle::~TypeHandle() {
	duckdb_destroy_logical_type(&type_);
}

namespace {

duckdb_scalar_function make_scalar(const char *name, std::initializer_list<Ty> params, Ty ret,
                                   duckdb_scalar_function_t fn, bool side_effects = false) {
	duckdb_scalar_function f = duckdb_create_scalar_function();
	duckdb_scalar_function_set_name(f, name);
	for (Ty t : params) {
		TypeHandle h(t);
		duckdb_scalar_function_add_parameter(f, h.get());
	}
	TypeHandle r(ret);
	duckdb_scalar_function_set_return_type(f, r.get());
	duckdb_scalar_function_set_function(f, fn);
	if (side_effects) { // never folded or merged by DuckDB
		duckdb_scalar_function_set_volatile(f);
	}
	return f;
}

bool add_scalar(duckdb_connection con, const char *name, std::initializer_list<Ty> params, Ty ret,
                duckdb_scalar_function_t fn, bool side_effects = false) {
	duckdb_scalar_function f = make_scalar(name, params, ret, fn, side_effects);
	bool ok = duckdb_register_scalar_function(con, f) == DuckDBSuccess;
	duckdb_destroy_scalar_function(&f);
	return ok;
}

// DuckDB's `threads` setting of the database this connection belongs to (hardware threads if unknown).
int database_threads(duckdb_connection con) {
	int fallback = static_cast<int>(std::thread::hardware_concurrency());
	fallback = fallback < 1 ? 1 : fallback;
	duckdb_result res;
	if (duckdb_query(con, "SELECT CAST(current_setting('threads') AS BIGINT)", &res) != DuckDBSuccess) {
		duckdb_destroy_result(&res);
		return fallback;
	}
	const int64_t v = duckdb_value_int64(&res, 0, 0);
	duckdb_destroy_result(&res);
	return v >= 1 && v <= 4096 ? static_cast<int>(v) : fallback;
}

// tensor_source(key) and tensor_source(key, start, shape): volatile, so a prepared statement re-reads its slots.
bool register_sources(duckdb_connection con) {
	const Ty L = Ty::ListBigInt;
	duckdb_scalar_function_set set = duckdb_create_scalar_function_set("tensor_source");
	duckdb_scalar_function s1 = make_scalar("tensor_source", {Ty::BigInt}, Ty::Blob, tensor_source, true);
	duckdb_scalar_function s3 = make_scalar("tensor_source", {Ty::BigInt, L, L}, Ty::Blob, tensor_source_block, true);
	const bool ok = duckdb_add_scalar_function_to_set(set, s1) == DuckDBSuccess &&
	                duckdb_add_scalar_function_to_set(set, s3) == DuckDBSuccess &&
	                duckdb_register_scalar_function_set(con, set) == DuckDBSuccess;
	duckdb_destroy_scalar_function(&s1);
	duckdb_destroy_scalar_function(&s3);
	duckdb_destroy_scalar_function_set(&set);
	return ok;
}

// tensor_from_list over DOUBLE[], BIGINT[] or UBIGINT[]: integer lists convert exactly (a BIGINT[] of int64
// values does not pass through DOUBLE).
bool register_from_list(duckdb_connection con) {
	duckdb_scalar_function_set set = duckdb_create_scalar_function_set("tensor_from_list");
	duckdb_scalar_function fs[] = {
	    make_scalar("tensor_from_list", {Ty::ListDouble, Ty::Varchar}, Ty::Blob, tensor_from_list),
	    make_scalar("tensor_from_list", {Ty::ListBigInt, Ty::Varchar}, Ty::Blob, tensor_from_bigint_list),
	    make_scalar("tensor_from_list", {Ty::ListUBigInt, Ty::Varchar}, Ty::Blob, tensor_from_ubigint_list)};
	bool ok = true;
	for (auto &f : fs) {
		ok = ok && duckdb_add_scalar_function_to_set(set, f) == DuckDBSuccess;
	}
	ok = ok && duckdb_register_scalar_function_set(con, set) == DuckDBSuccess;
	for (auto &f : fs) {
		duckdb_destroy_scalar_function(&f);
	}
	duckdb_destroy_scalar_function_set(&set);
	return ok;
}

bool register_all(duckdb_connection con, KernelPath path) {
	using T = Ty;
	blas_single_threaded();
	auto budget = std::make_shared<ThreadBudget>(database_threads(con), path);
	if (!register_einsum_functions(con, budget) || !register_path_functions(con, budget) ||
	    !register_program_functions(con, budget) ||
	    !add_budgeted_scalar(con, "tensorsql_db_token", {}, T::BigInt, tensorsql_db_token, budget, false)) {
		return false;
	}
	const T B = T::Blob, V = T::Varchar, L = T::ListBigInt;
	bool ok = add_budgeted_scalar(con, "tensorsql_kernel_path", {}, V, tensorsql_kernel_path, budget, false);
	// the functions that allocate blocks charge them to the database's kernel memory (the budget's Control)
	// The kernels that compute a block are volatile (so are tensor_einsum and tensor_einsum_path): DuckDB then
	// never evaluates a call twice. A deterministic one it copies into a filter it pushes down: a statement's
	// "NOT tensor IS NULL" over its padding rows ran every block product of a positional join twice.
	ok = ok && add_budgeted_scalar(con, "tensor_einsum1", {V, V, V, B, L}, B, tensor_einsum1, budget, true);
	ok = ok && add_budgeted_scalar(con, "tensor_cast", {B, V, V}, B, tensor_cast, budget, true);
	ok = ok && add_budgeted_scalar(con, "tensor_zeros", {V, L}, B, tensor_zeros, budget, false);
	ok = ok && add_budgeted_scalar(con, "tensor_slice", {V, B, L, L, L}, B, tensor_slice, budget, true);
	ok = ok && add_budgeted_scalar(con, "tensor_slice_strided", {V, B, L, L, L, L}, B, tensor_slice_strided, budget,
	                               true);
	ok = ok && add_scalar(con, "tensor_numel", {B, V}, T::BigInt, tensor_numel);
	ok = ok && add_scalar(con, "tensor_itemsize", {V}, T::Integer, tensor_itemsize);
	ok = ok && add_scalar(con, "tensor_check", {B, V, L}, T::Boolean, tensor_check);
	ok = ok && add_scalar(con, "tensor_to_list", {B, V}, T::ListDouble, tensor_to_list);
	ok = ok && add_scalar(con, "tensor_to_bigint_list", {B, V}, T::ListBigInt, tensor_to_bigint_list);
	ok = ok && add_scalar(con, "tensor_to_ubigint_list", {B, V}, T::ListUBigInt, tensor_to_ubigint_list);
	ok = ok && add_scalar(con, "tensor_get", {B, V, L, L}, T::Double, tensor_get);
	ok = ok && add_scalar(con, "tensorsql_kernels_version", {}, V, tensorsql_kernels_version);
	ok = ok && add_scalar(con, "tensor_pin", {L}, L, tensor_pin, true);
	ok = ok && add_scalar(con, "tensor_sink_write", {T::BigInt, L, V, B, L}, T::BigInt, tensor_sink_write, true);
	if (!ok) {
		return false;
	}
	duckdb_scalar_function_set set = duckdb_create_scalar_function_set("tensor_map");
	duckdb_scalar_function m3 = make_scalar("tensor_map", {V, V, B}, B, tensor_map, true);
	duckdb_scalar_function m4 = make_scalar("tensor_map", {V, V, B, T::Double}, B, tensor_map_param, true);
	attach_budget(m3, budget);
	attach_budget(m4, budget);
	ok = duckdb_add_scalar_function_to_set(set, m3) == DuckDBSuccess &&
	     duckdb_add_scalar_function_to_set(set, m4) == DuckDBSuccess &&
	     duckdb_register_scalar_function_set(con, set) == DuckDBSuccess;
	duckdb_destroy_scalar_function(&m3);
	duckdb_destroy_scalar_function(&m4);
	duckdb_destroy_scalar_function_set(&set);
	ok = ok && register_sources(con) && register_from_list(con);
	return ok && register_aggregates(con, budget);
}

} // namespace
} // namespace tsk

DUCKDB_EXTENSION_ENTRYPOINT(duckdb_connection connection, duckdb_extension_info info,
                            struct duckdb_extension_access *access) {
	try {
		// the database's kernel path, read once here: an invalid value makes the LOAD fail
		tsk::KernelPath path = tsk::KernelPath::Generic;
		std::string error;
		if (!tsk::parse_kernel_path(std::getenv(tsk::kKernelPathEnv), path, error)) {
			access->set_error(info, error.c_str());
			return false;
		}
		if (!tsk::register_all(connection, path)) {
			access->set_error(info, "tensorsql_kernels: failed to register a function");
			return false;
		}
		return true;
	} catch (...) {
		access->set_error(info, "tensorsql_kernels: internal error during registration");
		return false;
	}
}
