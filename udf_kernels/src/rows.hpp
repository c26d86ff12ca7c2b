// The per-row preamble of the SQL functions, written once: which rows of a chunk to compute (NULL handling),
// and argument readers that validate as they read (dtype names; blocks against their dtype and shape, before
// any kernel touches their memory).
//
// A scalar function's body is
//
//     DTypeCol dtype_c(input, 0);
//     BlockCol x(input, 1, 2, "x");                  // x BLOB, x_shape BIGINT[]
//     scalar_rows(input, output, all_valid(dtype_c, x), [&](idx_t row) {
//         const DType dt = dtype_c.get(row, FN);
//         x.read(row, dt, FN);                        // x.bytes, x.shape: validated
//         ...
//     });
//
// and an aggregate's update the same with update_rows (a row with a NULL argument adds nothing to its group).
// Every reader is a local of one callback call: no state outlives it or is shared between threads.
#pragma once

#include "dtype.hpp"

#include <string>

namespace tsk {

// valid(row) of several arguments at once (anything with `bool valid(idx_t) const`): true when none is NULL.
template <class... A>
auto all_valid(const A &...args) {
	return [&args...](idx_t row) { return (args.valid(row) && ...); };
}

// Calls body(row) for each row of the chunk where valid(row), on_null(row) for the others.
template <class Valid, class Body, class OnNull>
void for_each_row(duckdb_data_chunk input, Valid &&valid, Body &&body, OnNull &&on_null) {
	const idx_t count = duckdb_data_chunk_get_size(input);
	for (idx_t row = 0; row < count; row++) {
		if (valid(row)) {
			body(row);
		} else {
			on_null(row);
		}
	}
}

// The rows of a scalar function: a row with a NULL argument gets a NULL result.
template <class Valid, class Body>
void scalar_rows(duckdb_data_chunk input, duckdb_vector output, Valid &&valid, Body &&body) {
	for_each_row(input, valid, body, [output](idx_t row) { set_null(output, row); });
}

// The rows of an aggregate's update: a row with a NULL argument adds nothing to its group.
template <class Valid, class Body>
void update_rows(duckdb_data_chunk input, Valid &&valid, Body &&body) {
	for_each_row(input, valid, body, [](idx_t) {});
}

// A dtype argument (VARCHAR), parsed once per distinct string.
class DTypeCol {
public:
	DTypeCol(duckdb_data_chunk input, idx_t col) : c_(input, col) {
	}
	bool valid(idx_t row) const {
		return c_.valid(row);
	}
	DType get(idx_t row, const char *fn, const char *arg = "dtype") {
		return cache_.get(c_.str(row), fn, arg);
	}

private:
	Col c_;
	DTypeArg cache_;
};

// A block argument without a shape (BLOB): validated as a whole number of elements of its dtype.
class BlobCol {
public:
	// what: how errors name it ("operand x")
	BlobCol(duckdb_data_chunk input, idx_t col, const char *what = "operand x") : c_(input, col), what_(what) {
	}
	bool valid(idx_t row) const {
		return c_.valid(row);
	}
	// The row's bytes, not validated (tensor_check's question).
	Bytes raw(idx_t row) const {
		return c_.str(row);
	}
	// Reads the row's blob into `bytes`; fails unless its length is a whole number of dt's elements. Returns
	// the element count.
	uint64_t read(idx_t row, DType dt, const char *fn) {
		bytes = c_.str(row);
		return check_whole(fn, what_, bytes, dt);
	}

	Bytes bytes;

private:
	Col c_;
	const char *what_;
};

// A block argument with its shape: a BLOB column and a BIGINT[] column, read and validated together.
class BlockCol {
public:
	// name: the operand's name in errors ("x": "operand x has 24 bytes but shape [2,3] of float64 needs 48");
	// shape_arg: the shape argument's name (default "<name>_shape")
	BlockCol(duckdb_data_chunk input, idx_t blob_col, idx_t shape_col, const char *name,
	         const char *shape_arg = nullptr)
	    : blob_c_(input, blob_col), shape_c_(input, shape_col), name_(name),
	      shape_arg_(shape_arg != nullptr ? std::string(shape_arg) : std::string(name) + "_shape") {
	}
	bool valid(idx_t row) const {
		return blob_c_.valid(row) && shape_c_.valid(row);
	}
	// Reads the row's blob and shape into `bytes` and `shape`; fails unless the blob holds exactly the bytes
	// the shape of dt needs. Returns the element count.
	uint64_t read(idx_t row, DType dt, const char *fn) {
		bytes = blob_c_.str(row);
		shape_c_.get(row, shape, fn, shape_arg_.c_str());
		return check_operand(fn, name_, bytes, shape, dt);
	}

	Bytes bytes;
	Shape shape;

private:
	Col blob_c_;
	ListCol shape_c_;
	const char *name_;
	std::string shape_arg_;
};

} // namespace tsk
