// The C callbacks of every SQL function, registered in register.cpp.
#pragma once

#include "common.hpp"

#include <initializer_list>
#include <memory>

namespace tsk {

// einsum.cpp
void tensor_einsum(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);
void tensor_einsum_into(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);
void tensor_einsum1(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);
void tensorsql_gemm_plan(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);

// map.cpp
void tensor_map(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);
void tensor_map_param(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);
void tensor_cast(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);

// layout.cpp
void tensor_zeros(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);
void tensor_slice(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);
void tensor_slice_strided(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);
void tensor_numel(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);
void tensor_itemsize(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);
void tensor_check(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);
void tensor_to_list(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);
void tensor_to_bigint_list(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);
void tensor_to_ubigint_list(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);
void tensor_from_list(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);
void tensor_from_bigint_list(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);
void tensor_from_ubigint_list(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);
void tensor_get(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);
void tensor_pin(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);
void tensorsql_kernels_version(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);

// einsum.cpp: registers tensor_einsum (scalar) and tensor_einsum_agg (aggregate), sharing one thread budget.
class ThreadBudget;
bool register_einsum_functions(duckdb_connection con, const std::shared_ptr<ThreadBudget> &budget);

// path.cpp: registers tensor_einsum_path and tensor_einsum_path_into (a tree of contractions in one call).
void tensor_einsum_path(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);
void tensor_einsum_path_into(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);
bool register_path_functions(duckdb_connection con, const std::shared_ptr<ThreadBudget> &budget);

// program.cpp: tensor_program_into (a one-block plan's whole graph in one call, into result sinks).
void tensor_program_into(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);
bool register_program_functions(duckdb_connection con, const std::shared_ptr<ThreadBudget> &budget);

// aggregates.cpp: registers tensor_sum/max/min/prod, tensor_assemble, tensor_pack (their states are charged to
// the budget's memory).
bool register_aggregates(duckdb_connection con, const std::shared_ptr<ThreadBudget> &budget);

// kernel_path.cpp: the database's kernel path (TENSORSQL_KERNEL_PATH at load); registered with the budget.
void tensorsql_kernel_path(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);

} // namespace tsk

namespace tsk {

// SQL types used in signatures (register.cpp).
enum class Ty { Varchar, Blob, BigInt, UBigInt, Integer, Double, Boolean, ListBigInt, ListUBigInt, ListDouble };

// Owns a duckdb_logical_type for the duration of a registration call.
class TypeHandle {
public:
	explicit TypeHandle(Ty t);
	~TypeHandle();
	TypeHandle(const TypeHandle &) = delete;
	TypeHandle &operator=(const TypeHandle &) = delete;
	duckdb_logical_type get() const {
		return type_;
	}

private:
	duckdb_logical_type type_;
};

// einsum.cpp: the thread budget a kernel's extra info holds (null when it has none), and the registration of a
// scalar function that gets the budget as its extra info. Side-effecting ones (writing a result sink, or
// that must run once per row) and the ones that compute a block are volatile, so DuckDB never folds, merges,
// moves or copies their calls (a copy into a pushed-down filter would compute every block twice);
// blob_varargs: any number of BLOB arguments after `params`.
ThreadBudget *budget_of(void *extra);
// The kernel memory budget (control.hpp) of a function's extra info; null when it has no thread budget.
MemoryBudget *memory_of_info(void *extra);
// Gives a function the budget as its extra info (owned by the function from then on).
void attach_budget(duckdb_scalar_function f, const std::shared_ptr<ThreadBudget> &budget);
void attach_budget(duckdb_aggregate_function a, const std::shared_ptr<ThreadBudget> &budget);
bool add_budgeted_scalar(duckdb_connection con, const char *name, std::initializer_list<Ty> params, Ty ret,
                         duckdb_scalar_function_t fn, const std::shared_ptr<ThreadBudget> &budget, bool side_effects,
                         bool blob_varargs = false);

} // namespace tsk
