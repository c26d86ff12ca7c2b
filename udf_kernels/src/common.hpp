// Shared helpers of the tensorsql_kernels DuckDB extension: C API access, argument readers,
// validation, error handling at the C boundary, aligned scratch buffers.
//
// Every SQL function body runs inside guard(), which turns any C++ exception into a DuckDB error
// (duckdb_scalar_function_set_error / duckdb_aggregate_function_set_error). Nothing throws across the
// C boundary and there is no mutable global state apart from the API struct the entry point fills once.
#pragma once

#include "duckdb_extension.h"

#include <cstddef>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

DUCKDB_EXTENSION_EXTERN

#ifndef TENSORSQL_KERNELS_VERSION
#define TENSORSQL_KERNELS_VERSION "0.1.0"
#endif

namespace tsk {

// A user-visible kernel error. The message names the function, the argument and the sizes.
struct KernelError : std::runtime_error {
	using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail(const std::string &msg) {
	throw KernelError(msg);
}

// DuckDB stores a BLOB's length in 32 bits; no block can be larger than this.
constexpr uint64_t kMaxBlobBytes = 0xFFFFFFFFull;
// Upper bound on the iteration count of one einsum call (label-size product); beyond it is absurd.
constexpr uint64_t kMaxIterations = uint64_t(1) << 62;

// Every error of a kernel that ran out of memory contains this marker; tensorsql maps it to OutOfMemoryError.
constexpr const char *kOutOfMemory = "tensorsql: out of memory";

// One database's byte budget for the kernels' own memory (control.hpp; its Control owns it). Big buffers charge
// it before they allocate and release it when freed; a charge that would pass the limit fails with an error
// carrying kOutOfMemory that names the function, what it was allocating and the sizes. Both are no-ops for a
// null budget (defined in control.cpp).
class MemoryBudget;
void memory_charge(MemoryBudget *m, uint64_t bytes, const char *fn, const char *what);
void memory_release(MemoryBudget *m, uint64_t bytes) noexcept;
// The error for an allocation the system refused (after the budget allowed it).
[[noreturn]] void out_of_memory(const char *fn, const char *what, uint64_t bytes);

// The blobs one call hands to DuckDB, which copies each into its result vector: charged to the budget until the
// call returns (DuckDB frees them once it has consumed the chunk, which the kernels cannot see), so a single
// chunk of results cannot pass the limit unnoticed.
class CallCharge {
public:
	CallCharge(MemoryBudget *m, const char *fn) : m_(m), fn_(fn) {
	}
	CallCharge(const CallCharge &) = delete;
	CallCharge &operator=(const CallCharge &) = delete;
	~CallCharge() {
		memory_release(m_, held_);
	}
	void add(uint64_t bytes, const char *what) {
		memory_charge(m_, bytes, fn_, what);
		held_ += bytes;
	}

private:
	MemoryBudget *m_;
	const char *fn_;
	uint64_t held_ = 0;
};

using Shape = std::vector<int64_t>;

inline std::string quoted(const std::string &s) {
	return "'" + s + "'";
}

// Length (1-4) of the well-formed UTF-8 sequence at s[i] (i < n), or 0 when the bytes there are not one: an
// error message that quotes user text must be valid UTF-8, or the DuckDB client cannot decode it.
inline size_t utf8_len(const char *s, size_t n, size_t i) {
	const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
	const unsigned c = b(i);
	if (c < 0x80) {
		return 1;
	}
	size_t len;
	unsigned lo = 0x80, hi = 0xBF; // the allowed range of the second byte (no overlong forms, no surrogates)
	if (c >= 0xC2 && c <= 0xDF) {
		len = 2;
	} else if (c >= 0xE0 && c <= 0xEF) {
		len = 3;
		lo = c == 0xE0 ? 0xA0 : 0x80;
		hi = c == 0xED ? 0x9F : 0xBF;
	} else if (c >= 0xF0 && c <= 0xF4) {
		len = 4;
		lo = c == 0xF0 ? 0x90 : 0x80;
		hi = c == 0xF4 ? 0x8F : 0xBF;
	} else {
		return 0;
	}
	if (i + len > n || b(i + 1) < lo || b(i + 1) > hi) {
		return 0;
	}
	for (size_t k = 2; k < len; k++) {
		if (b(i + k) < 0x80 || b(i + k) > 0xBF) {
			return 0;
		}
	}
	return len;
}

// s as valid UTF-8: each byte that does not begin a well-formed sequence becomes U+FFFD.
inline std::string valid_utf8(const char *s, size_t n) {
	std::string r;
	r.reserve(n);
	for (size_t i = 0; i < n;) {
		const size_t len = utf8_len(s, n, i);
		if (len == 0) {
			r += "\xEF\xBF\xBD";
			i++;
		} else {
			r.append(s + i, len);
			i += len;
		}
	}
	return r;
}

inline std::string valid_utf8(const std::string &s) {
	return valid_utf8(s.data(), s.size());
}

inline std::string shape_str(const Shape &s) {
	std::string r = "[";
	for (size_t i = 0; i < s.size(); i++) {
		if (i) {
			r += ",";
		}
		r += std::to_string(s[i]);
	}
	return r + "]";
}

// A non-owning view of a VARCHAR or BLOB value.
struct Bytes {
	const char *data = nullptr;
	size_t size = 0;

	std::string str() const {
		return std::string(data, size);
	}
	const unsigned char *udata() const {
		return reinterpret_cast<const unsigned char *>(data);
	}
};

// User text (a name or spec argument) quoted for an error message, as valid UTF-8.
inline std::string quoted_text(const Bytes &b) {
	return quoted(valid_utf8(b.data, b.size));
}

inline bool same_bytes(const Bytes &b, const std::string &s) {
	return b.size == s.size() && (b.size == 0 || std::memcmp(b.data, s.data(), b.size) == 0);
}

// ---------------------------------------------------------------------------------------------
// Input columns. The C API hands scalar and aggregate callbacks flat vectors.
// ---------------------------------------------------------------------------------------------

class Col {
public:
	explicit Col(duckdb_vector v)
	    : data_(duckdb_vector_get_data(v)), validity_(duckdb_vector_get_validity(v)) {
	}
	Col(duckdb_data_chunk chunk, idx_t i) : Col(duckdb_data_chunk_get_vector(chunk, i)) {
	}

	bool valid(idx_t row) const {
		return validity_ == nullptr || duckdb_validity_row_is_valid(validity_, row);
	}
	Bytes str(idx_t row) const {
		const duckdb_string_t &s = static_cast<const duckdb_string_t *>(data_)[row];
		uint32_t len = s.value.inlined.length;
		const char *p = len <= 12 ? s.value.inlined.inlined : s.value.pointer.ptr;
		return Bytes {p, len};
	}
	int64_t i64(idx_t row) const {
		return static_cast<const int64_t *>(data_)[row];
	}
	double f64(idx_t row) const {
		return static_cast<const double *>(data_)[row];
	}

private:
	void *data_;
	uint64_t *validity_;
};

// A LIST column (BIGINT[] or DOUBLE[]).
class ListCol {
public:
	explicit ListCol(duckdb_vector v) : outer_(v) {
		duckdb_vector child = duckdb_list_vector_get_child(v);
		entries_ = static_cast<const duckdb_list_entry *>(duckdb_vector_get_data(v));
		child_data_ = duckdb_vector_get_data(child);
		child_validity_ = duckdb_vector_get_validity(child);
	}
	ListCol(duckdb_data_chunk chunk, idx_t i) : ListCol(duckdb_data_chunk_get_vector(chunk, i)) {
	}

	bool valid(idx_t row) const {
		return outer_.valid(row);
	}
	// Reads the list at `row` into `out`; NULL elements are an error naming fn and arg.
	template <class T>
	void get(idx_t row, std::vector<T> &out, const char *fn, const char *arg) const {
		const duckdb_list_entry &e = entries_[row];
		out.resize(e.length);
		const T *src = static_cast<const T *>(child_data_);
		for (idx_t k = 0; k < e.length; k++) {
			idx_t c = e.offset + k;
			if (child_validity_ != nullptr && !duckdb_validity_row_is_valid(child_validity_, c)) {
				fail(std::string(fn) + ": " + arg + " contains NULL at position " + std::to_string(k));
			}
			out[k] = src[c];
		}
	}

private:
	Col outer_;
	const duckdb_list_entry *entries_;
	const void *child_data_;
	uint64_t *child_validity_;
};

// ---------------------------------------------------------------------------------------------
// Output helpers.
// ---------------------------------------------------------------------------------------------

inline void set_null(duckdb_vector out, idx_t row) {
	duckdb_vector_ensure_validity_writable(out);
	duckdb_validity_set_row_invalid(duckdb_vector_get_validity(out), row);
}

inline void set_blob(duckdb_vector out, idx_t row, const void *data, size_t bytes) {
	static const char empty[1] = {0};
	const char *p = bytes == 0 || data == nullptr ? empty : static_cast<const char *>(data);
	duckdb_vector_assign_string_element_len(out, row, p, bytes);
}

// Sets row `row` of BLOB vector `out` to `bytes` at `data` without copying them: the vector's entry points
// at the caller's memory, which must stay valid and unchanged until the query that reads the vector ends.
// Only tensor_source uses it, over a slot's lent array (the caller holds the array, and clears the slot,
// only after the query is done). Blobs short enough to be inlined (12 bytes) are copied as DuckDB requires.
inline void set_blob_ref(duckdb_vector out, idx_t row, const void *data, size_t bytes) {
	constexpr size_t kInlined = 12; // duckdb_string_t's inlined bytes
	static_assert(sizeof(duckdb_string_t) == 16, "DuckDB's string_t layout");
	if (bytes <= kInlined || data == nullptr) {
		set_blob(out, row, data, bytes);
		return;
	}
	duckdb_string_t &s = static_cast<duckdb_string_t *>(duckdb_vector_get_data(out))[row];
	s.value.pointer.length = static_cast<uint32_t>(bytes); // bytes <= kMaxBlobBytes, checked by the callers
	std::memcpy(s.value.pointer.prefix, data, sizeof(s.value.pointer.prefix));
	s.value.pointer.ptr = static_cast<char *>(const_cast<void *>(data)); // DuckDB's type is not const; read only
}

// ---------------------------------------------------------------------------------------------
// Sizes.
// ---------------------------------------------------------------------------------------------

// Number of elements of `shape`, validated: entries >= 0, no overflow, bytes within the BLOB limit.
// The product of the non-zero entries must also fit, so strides computed from any valid shape fit in int64.
inline uint64_t checked_numel(const Shape &shape, size_t itemsize, const char *fn, const char *arg) {
	uint64_t n = 1;
	bool zero = false;
	for (int64_t d : shape) {
		if (d < 0) {
			fail(std::string(fn) + ": " + arg + " " + shape_str(shape) + " has a negative dimension");
		}
	}
	for (int64_t d : shape) {
		if (d == 0) {
			zero = true;
			continue;
		}
		uint64_t next;
		if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &next) || next > kMaxBlobBytes / itemsize) {
			fail(std::string(fn) + ": " + arg + " " + shape_str(shape) + " is too large (a block is at most " +
			     std::to_string(kMaxBlobBytes) + " bytes)");
		}
		n = next;
	}
	return zero ? 0 : n;
}

// Aligned storage for blocks and scratch, reused across rows (blob data from DuckDB may be unaligned). Growing
// keeps the first size() bytes; new bytes are left uninitialized (callers write every byte they read, or call
// zeros()), so a fresh multi-megabyte buffer is not cleared once by the allocator and again by its user.
//
// Copies share the storage and the first write access through either copy detaches it (copy-on-write): an
// aggregate combine that takes over a partial state into an empty target costs nothing, where a deep copy of
// a 64 MiB block took ~50 ms. Every non-const accessor counts as a write. Buffers of 2 MiB and more are
// 2 MiB-aligned and advised for transparent huge pages: a first touch then faults once per 2 MiB instead of
// once per 4 KiB page, which on this kind of VM is what makes fresh memory ~4x slower to fill than reused.
//
// A buffer bound to a memory budget (charge_to) charges every allocation to it and releases it when the
// storage is freed; copies keep the binding.
class AlignedBuf {
public:
	AlignedBuf() = default;
	AlignedBuf(MemoryBudget *m, const char *fn, const char *what) : mem_(m), fn_(fn), what_(what) {
	}
	AlignedBuf(const AlignedBuf &) = default;
	AlignedBuf &operator=(const AlignedBuf &) = default;
	AlignedBuf(AlignedBuf &&) noexcept = default;
	AlignedBuf &operator=(AlignedBuf &&) noexcept = default;

	unsigned char *resize(size_t bytes) {
		if (bytes > cap_ || shared()) {
			reallocate(bytes > cap_ ? bytes : cap_, bytes < size_ ? bytes : size_);
		}
		size_ = bytes;
		return raw();
	}
	// Resize and fill with zero bytes.
	unsigned char *zeros(size_t bytes) {
		resize(bytes);
		if (bytes) {
			std::memset(raw(), 0, bytes);
		}
		return raw();
	}
	unsigned char *data() {
		detach();
		return raw();
	}
	const unsigned char *data() const {
		return raw();
	}
	template <class T>
	T *as() {
		detach();
		return reinterpret_cast<T *>(raw());
	}
	template <class T>
	const T *as() const {
		return reinterpret_cast<const T *>(raw());
	}
	size_t size() const {
		return size_;
	}
	bool empty() const {
		return size_ == 0;
	}
	// Charges this buffer's allocations to m (null: none); fn and what name it in an out-of-memory error.
	AlignedBuf &charge_to(MemoryBudget *m, const char *fn, const char *what) {
		mem_ = m;
		fn_ = fn;
		what_ = what;
		return *this;
	}
	// An empty buffer charged like this one.
	AlignedBuf sibling() const {
		return AlignedBuf(mem_, fn_, what_);
	}

private:
	static constexpr size_t kAlign = 64;
	static constexpr size_t kHuge = size_t(2) << 20;

	// use_count() == 1 cannot change under us: another owner would need a reference to this object.
	bool shared() const {
		return store_ && store_.use_count() > 1;
	}
	void detach() {
		if (shared()) {
			reallocate(cap_, size_);
		}
	}
	void reallocate(size_t cap, size_t keep) {
		std::shared_ptr<unsigned char> fresh = allocate(cap);
		if (keep && fresh) {
			std::memcpy(fresh.get(), store_.get(), keep);
		}
		store_ = std::move(fresh);
		cap_ = cap;
	}
	std::shared_ptr<unsigned char> allocate(size_t bytes) const {
		if (bytes == 0) {
			return nullptr;
		}
		const size_t align = bytes >= kHuge ? kHuge : kAlign;
		if (bytes > std::numeric_limits<size_t>::max() - align) {
			out_of_memory(fn_, what_, bytes);
		}
		const size_t rounded = (bytes + align - 1) / align * align;
		memory_charge(mem_, rounded, fn_, what_);
		void *p = std::aligned_alloc(align, rounded);
		if (p == nullptr) {
			memory_release(mem_, rounded);
			out_of_memory(fn_, what_, rounded);
		}
#ifdef MADV_HUGEPAGE
		if (align == kHuge) {
			madvise(p, rounded, MADV_HUGEPAGE); // advice only: failure leaves ordinary pages
		}
#endif
		// (should the control block's allocation fail, shared_ptr runs the deleter: freed and released)
		MemoryBudget *m = mem_;
		return std::shared_ptr<unsigned char>(static_cast<unsigned char *>(p), [m, rounded](unsigned char *q) {
			std::free(q);
			memory_release(m, rounded);
		});
	}
	unsigned char *raw() const {
		return store_.get();
	}

	std::shared_ptr<unsigned char> store_;
	size_t cap_ = 0; // bytes
	size_t size_ = 0;
	MemoryBudget *mem_ = nullptr;
	const char *fn_ = "tensorsql kernel";
	const char *what_ = "a buffer";
};

// Returns a pointer to the blob's elements usable as T*: the blob itself when suitably aligned,
// else a copy in `scratch`.
template <class T>
const T *aligned_view(const Bytes &blob, AlignedBuf &scratch) {
	if (reinterpret_cast<uintptr_t>(blob.data) % alignof(T) == 0) {
		return reinterpret_cast<const T *>(blob.data);
	}
	unsigned char *p = scratch.resize(blob.size);
	if (blob.size) {
		std::memcpy(p, blob.data, blob.size);
	}
	return scratch.as<T>();
}

// Caches the parse of a string argument: re-parses only when the string changes between rows.
template <class V>
class Cached {
public:
	template <class Parse>
	const V &get(const Bytes &s, Parse &&parse) {
		if (!has_ || !same_bytes(s, key_)) {
			value_ = parse(s);
			key_ = s.str();
			has_ = true;
		}
		return value_;
	}

private:
	bool has_ = false;
	std::string key_;
	V value_ {};
};

// ---------------------------------------------------------------------------------------------
// The C boundary.
// ---------------------------------------------------------------------------------------------

template <class SetError, class F>
void guard_with(SetError set_error, const char *fn, F &&body) noexcept {
	try {
		body();
	} catch (const KernelError &e) {
		set_error(e.what());
	} catch (const std::bad_alloc &) {
		set_error((std::string(fn) + ": " + kOutOfMemory + " (the system refused an allocation)").c_str());
	} catch (const std::exception &e) {
		set_error((std::string(fn) + ": internal error: " + e.what()).c_str());
	} catch (...) {
		set_error((std::string(fn) + ": unknown internal error").c_str());
	}
}

template <class F>
void guard_scalar(duckdb_function_info info, const char *fn, F &&body) noexcept {
	guard_with([info](const char *m) { duckdb_scalar_function_set_error(info, m); }, fn, std::forward<F>(body));
}

template <class F>
void guard_aggregate(duckdb_function_info info, const char *fn, F &&body) noexcept {
	guard_with([info](const char *m) { duckdb_aggregate_function_set_error(info, m); }, fn, std::forward<F>(body));
}

// ---------------------------------------------------------------------------------------------
// Strided block copy (slice, assemble): copies `region` elements from src[src_off...] to dst[dst_off...].
// All arguments must already be validated against the shapes.
// ---------------------------------------------------------------------------------------------

void copy_region(unsigned char *dst, const Shape &dst_shape, const Shape &dst_off, const unsigned char *src,
                 const Shape &src_shape, const Shape &src_off, const Shape &region, size_t itemsize);

} // namespace tsk
