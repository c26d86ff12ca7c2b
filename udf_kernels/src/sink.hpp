// Result sinks: an output array the caller (tensorsql's Python side) lends to one query, so each result block
// is written once, straight into the array the caller returns, instead of kernel buffer -> DuckDB blob ->
// Arrow buffer -> numpy (two to three extra passes over the whole result).
//
// The caller registers the array through the extension's C ABI (tensorsql_sink_open, reached with ctypes,
// not from SQL) and gets back a random 63-bit key; SQL functions name the key and the block's start, and
// every write is bounds-checked against the registered shape. A key that was never handed out, or is
// already closed, is an error, so a SQL user cannot write anywhere without a key the caller gave out.
//
// This registry is the one piece of process-wide mutable state in the extension: the C ABI entry points have
// no database to hang it on. It is guarded by a mutex; a lookup copies the entry, and the caller closes a
// sink only after the query that writes to it has returned.
#pragma once

#include "dtype.hpp"
#include "permute.hpp"
#include "spec.hpp"

namespace tsk {

struct Sink {
	unsigned char *base = nullptr;
	DType dtype = DType::F64;
	Shape shape;
	Shape strides; // in elements, C order
};

// The registered sink `key`; fails naming fn when there is none.
Sink sink_find(int64_t key, const char *fn);

// Validates a block of shape `block` at element coordinates `start` against the sink (rank, bounds, dtype);
// returns the element offset of the block's first element.
int64_t sink_block_offset(const Sink &s, DType dt, const Shape &start, const Shape &block, const char *fn);

// Whether the block's elements are one contiguous run of the sink in C order (then a kernel may write the
// block there directly, as if it were its own buffer).
bool sink_block_contiguous(const Sink &s, const Shape &block);

// Copies a block into the sink at element offset `off`. `loops` walk the block in Z's C order with
// Loop::sx = the source stride (a contiguous block when empty: strides from `block`).
template <class T>
void sink_write(const Sink &s, int64_t off, const Shape &block, const std::vector<Loop> &loops, const T *src) {
	std::vector<Loop> L(block.size());
	int64_t st = 1;
	for (size_t d = block.size(); d-- > 0;) {
		L[d].size = block[d];
		L[d].sx = loops.empty() ? st : loops[d].sx;
		L[d].sy = s.strides[d];
		st *= block[d];
	}
	strided_copy(L.data(), L.size(), src, reinterpret_cast<T *>(s.base) + off, Assign {});
}

// The sink key and block start of the *_into variants and tensor_sink_write (columns 0 and 1); the sink is looked up when the key
// changes, so a wrong key fails on its first row.
struct SinkArgs {
	Col key_c;
	ListCol start_c;
	Sink sink;
	int64_t key = 0;
	Shape start;

	explicit SinkArgs(duckdb_data_chunk input) : key_c(input, 0), start_c(input, 1) {
	}
	bool valid(idx_t row) const {
		return key_c.valid(row) && start_c.valid(row);
	}
	const Sink &read(idx_t row, const char *fn) {
		const int64_t k = key_c.i64(row);
		if (sink.base == nullptr || k != key) {
			sink = sink_find(k, fn);
			key = k;
		}
		start_c.get(row, start, fn, "start");
		return sink;
	}
};

// tensor_sink_write(key BIGINT, start BIGINT[], dtype VARCHAR, x BLOB, x_shape BIGINT[]) -> BIGINT
void tensor_sink_write(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);

// Slots (the same registry): a key reserved once (tensorsql_slot_new) and re-pointed at a new array before each
// run of a prepared statement whose text names the key (tensorsql_slot_set), so repeated small calls need no
// new SQL. A result sink is a slot set writable; the writers above refuse a slot set read-only or empty.
//
// The slot `key` for reading; fails naming fn when there is none or it is empty.
Sink source_find(int64_t key, const char *fn);

// tensor_source(key BIGINT) -> BLOB: the slot's whole array in C order, not copied: the blob points at the
// lent array, so the array must stay alive and unchanged until the query is over (the Python Slot holds it,
// and tensorsql clears a slot only after the query that reads it has finished). Volatile, so a prepared
// statement reads the slot again at every EXECUTE.
void tensor_source(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);
// tensor_source(key BIGINT, start BIGINT[], shape BIGINT[]) -> BLOB: the block of `shape` at element
// coordinates `start` of the slot's array.
void tensor_source_block(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output);

} // namespace tsk

extern "C" {
// Registers `ndim`-dimensional C-contiguous array `base` of `dtype` ('float32', ...) and `shape`; returns its
// key (> 0), or -1 for invalid arguments.
__attribute__((visibility("default"))) int64_t tensorsql_sink_open(void *base, const char *dtype, int64_t ndim,
                                                                   const int64_t *shape);
// Unregisters a sink; returns 0, or -1 when the key is not registered.
__attribute__((visibility("default"))) int tensorsql_sink_close(int64_t key);

// Slots. Every entry point returns -1 for invalid arguments or an unknown key, and never throws.
// Reserves an empty slot; returns its random 63-bit key (> 0), or -1.
__attribute__((visibility("default"))) int64_t tensorsql_slot_new(void);
// Points slot `key` at `ndim`-dimensional C-contiguous array `base` of `dtype` and `shape` (validated as in
// tensorsql_sink_open; the slot is left unchanged when they are invalid); writable != 0 lets the writers
// (tensor_einsum_into, ...) write there. Returns 0 or -1.
__attribute__((visibility("default"))) int tensorsql_slot_set(int64_t key, void *base, const char *dtype,
                                                              int64_t ndim, const int64_t *shape, int writable);
// Empties slot `key` (the key stays reserved); returns 0 or -1.
__attribute__((visibility("default"))) int tensorsql_slot_clear(int64_t key);
// Releases slot `key`; returns 0 or -1.
__attribute__((visibility("default"))) int tensorsql_slot_free(int64_t key);
}
