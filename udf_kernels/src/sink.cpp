// Result sinks and slots (see sink.hpp): the registry behind the C ABI, tensor_sink_write and tensor_source.
#include "sink.hpp"

#include "functions.hpp"
#include "rows.hpp"

#include <mutex>
#include <random>
#include <unordered_map>

namespace tsk {

namespace {

// A slot: empty (base == nullptr) or an array lent by the caller, writable or not.
struct Slot {
	Sink sink;
	bool writable = false;
};

struct Registry {
	std::mutex mu;
	std::unordered_map<int64_t, Slot> slots;
	std::mt19937_64 rng {std::random_device {}()};
};

Registry &registry() {
	static Registry r;
	return r;
}

} // namespace

Sink sink_find(int64_t key, const char *fn) {
	Registry &r = registry();
	std::lock_guard<std::mutex> lock(r.mu);
	auto it = r.slots.find(key);
	if (it == r.slots.end()) {
		fail(std::string(fn) + ": no result sink with key " + std::to_string(key) +
		     " (sinks are opened by tensorsql for one query)");
	}
	if (it->second.sink.base == nullptr) {
		fail(std::string(fn) + ": slot " + std::to_string(key) + " is empty (no array is lent to it)");
	}
	if (!it->second.writable) {
		fail(std::string(fn) + ": slot " + std::to_string(key) + " is read-only (its array was lent for reading)");
	}
	return it->second.sink;
}

Sink source_find(int64_t key, const char *fn) {
	Registry &r = registry();
	std::lock_guard<std::mutex> lock(r.mu);
	auto it = r.slots.find(key);
	if (it == r.slots.end()) {
		fail(std::string(fn) + ": no slot with key " + std::to_string(key) +
		     " (slots are reserved by tensorsql through the C ABI)");
	}
	if (it->second.sink.base == nullptr) {
		fail(std::string(fn) + ": slot " + std::to_string(key) + " is empty (no array is lent to it)");
	}
	return it->second.sink;
}

int64_t sink_block_offset(const Sink &s, DType dt, const Shape &start, const Shape &block, const char *fn) {
	if (dt != s.dtype) {
		fail(std::string(fn) + ": block dtype " + dtype_name(dt) + " but the sink holds " + dtype_name(s.dtype));
	}
	if (start.size() != s.shape.size() || block.size() != s.shape.size()) {
		fail(std::string(fn) + ": start " + shape_str(start) + " and block " + shape_str(block) +
		     " must have the sink's rank " + std::to_string(s.shape.size()));
	}
	int64_t off = 0;
	for (size_t d = 0; d < s.shape.size(); d++) {
		if (start[d] < 0 || block[d] < 0 || start[d] > s.shape[d] || block[d] > s.shape[d] - start[d]) {
			fail(std::string(fn) + ": block " + shape_str(block) + " at " + shape_str(start) +
			     " does not fit in the sink's shape " + shape_str(s.shape));
		}
		off += start[d] * s.strides[d];
	}
	return off;
}

bool sink_block_contiguous(const Sink &s, const Shape &block) {
	// contiguous iff, after the first axis longer than 1, every axis spans the sink's whole extent
	size_t d = 0;
	while (d < block.size() && block[d] == 1) {
		d++;
	}
	for (size_t e = d + 1; e < block.size(); e++) {
		if (block[e] != s.shape[e]) {
			return false;
		}
	}
	return true;
}

void tensor_sink_write(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensor_sink_write";
	guard_scalar(info, FN, [&] {
		SinkArgs sargs(input);
		DTypeCol dtype_c(input, 2);
		BlockCol x(input, 3, 4, "x");
		int64_t *out = static_cast<int64_t *>(duckdb_vector_get_data(output));
		AlignedBuf xa;
		scalar_rows(input, output, all_valid(sargs, dtype_c, x), [&](idx_t row) {
			const Sink &sink = sargs.read(row, FN);
			const DType dt = dtype_c.get(row, FN);
			const uint64_t n = x.read(row, dt, FN);
			const int64_t off = sink_block_offset(sink, dt, sargs.start, x.shape, FN);
			dispatch(dt, [&](auto tag) {
				using T = typename decltype(tag)::type;
				sink_write<T>(sink, off, x.shape, {}, aligned_view<T>(x.bytes, xa));
			});
			out[row] = static_cast<int64_t>(n);
		});
	});
}

namespace {

// Bytes of the slot's whole array (its shape was validated when it was set, so the product fits).
uint64_t source_bytes(const Sink &s) {
	uint64_t n = itemsize(s.dtype);
	for (int64_t d : s.shape) {
		n *= static_cast<uint64_t>(d);
	}
	return n;
}

// The slot named in column 0, looked up again only when the key changes between rows.
struct SourceArg {
	Col key_c;
	Sink sink;
	int64_t key = 0;

	explicit SourceArg(duckdb_data_chunk input) : key_c(input, 0) {
	}
	const Sink &read(idx_t row, const char *fn) {
		const int64_t k = key_c.i64(row);
		if (sink.base == nullptr || k != key) {
			sink = source_find(k, fn);
			key = k;
		}
		return sink;
	}
};

} // namespace

void tensor_source(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensor_source";
	guard_scalar(info, FN, [&] {
		const idx_t count = duckdb_data_chunk_get_size(input);
		SourceArg src(input);
		for (idx_t row = 0; row < count; row++) {
			if (!src.key_c.valid(row)) {
				set_null(output, row);
				continue;
			}
			const Sink &s = src.read(row, FN);
			const uint64_t bytes = source_bytes(s);
			if (bytes > kMaxBlobBytes) {
				fail(std::string(FN) + ": slot " + std::to_string(src.key) + " holds " + std::to_string(bytes) +
				     " bytes, more than a blob's " + std::to_string(kMaxBlobBytes) + " (read it in blocks)");
			}
			set_blob_ref(output, row, s.base, static_cast<size_t>(bytes)); // no copy: the array outlives the query
		}
	});
}

void tensor_source_block(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensor_source";
	guard_scalar(info, FN, [&] {
		const idx_t count = duckdb_data_chunk_get_size(input);
		SourceArg src(input);
		ListCol start_c(input, 1), shape_c(input, 2);
		Shape start, block, zero;
		AlignedBuf buf;
		for (idx_t row = 0; row < count; row++) {
			if (!src.key_c.valid(row) || !start_c.valid(row) || !shape_c.valid(row)) {
				set_null(output, row);
				continue;
			}
			const Sink &s = src.read(row, FN);
			start_c.get(row, start, FN, "start");
			shape_c.get(row, block, FN, "shape");
			const size_t isz = itemsize(s.dtype);
			const uint64_t n = checked_numel(block, isz, FN, "shape");
			if (start.size() != s.shape.size() || block.size() != s.shape.size()) {
				fail(std::string(FN) + ": start " + shape_str(start) + " and shape " + shape_str(block) +
				     " must have the rank " + std::to_string(s.shape.size()) + " of slot " + std::to_string(src.key));
			}
			int64_t off = 0;
			for (size_t d = 0; d < s.shape.size(); d++) {
				if (start[d] < 0 || start[d] > s.shape[d] || block[d] > s.shape[d] - start[d]) {
					fail(std::string(FN) + ": block " + shape_str(block) + " at " + shape_str(start) +
					     " does not fit in slot " + std::to_string(src.key) + "'s shape " + shape_str(s.shape));
				}
				off += start[d] * s.strides[d];
			}
			const size_t bytes = static_cast<size_t>(n) * isz;
			if (n == 0 || sink_block_contiguous(s, block)) { // one run of the array: the blob points at it
				set_blob_ref(output, row, s.base + static_cast<size_t>(off) * isz, bytes);
				continue;
			}
			zero.assign(block.size(), 0);
			unsigned char *z = buf.resize(bytes);
			copy_region(z, block, zero, s.base, s.shape, start, block, isz);
			set_blob(output, row, z, bytes);
		}
	});
}

} // namespace tsk

namespace tsk {
namespace {

// A sink over C-contiguous `base` (validated as tensorsql_sink_open documents); false when invalid.
bool make_sink(void *base, const char *dtype, int64_t ndim, const int64_t *shape, Sink &s) {
	if (base == nullptr || dtype == nullptr || ndim < 0 || ndim > 64 || (ndim > 0 && shape == nullptr)) {
		return false;
	}
	const DType dt = parse_dtype(Bytes {dtype, std::strlen(dtype)}, "tensorsql_slot_set"); // throws: false
	s.base = static_cast<unsigned char *>(base);
	s.dtype = dt;
	s.shape.assign(shape, shape + ndim);
	s.strides.assign(static_cast<size_t>(ndim), 1);
	uint64_t total = 1;
	for (int64_t d = ndim; d-- > 0;) {
		if (shape[d] < 0) {
			return false;
		}
		s.strides[static_cast<size_t>(d)] = static_cast<int64_t>(total);
		if (__builtin_mul_overflow(total, static_cast<uint64_t>(shape[d]), &total) ||
		    total > (uint64_t(1) << 62) / itemsize(dt)) {
			return false;
		}
	}
	return true;
}

// Reserves a fresh key holding `slot`; the caller holds no lock.
int64_t reserve(Slot slot) {
	Registry &r = registry();
	std::lock_guard<std::mutex> lock(r.mu);
	int64_t key = 0;
	while (key == 0 || r.slots.count(key) != 0) {
		key = static_cast<int64_t>(r.rng() >> 1);
	}
	r.slots.emplace(key, std::move(slot));
	return key;
}

} // namespace
} // namespace tsk

extern "C" {

int64_t tensorsql_sink_open(void *base, const char *dtype, int64_t ndim, const int64_t *shape) {
	using namespace tsk;
	try {
		Slot slot;
		if (!make_sink(base, dtype, ndim, shape, slot.sink)) {
			return -1;
		}
		slot.writable = true;
		return reserve(std::move(slot));
	} catch (...) {
		return -1;
	}
}

int tensorsql_sink_close(int64_t key) {
	return tensorsql_slot_free(key);
}

int64_t tensorsql_slot_new(void) {
	using namespace tsk;
	try {
		return reserve(Slot {});
	} catch (...) {
		return -1;
	}
}

int tensorsql_slot_set(int64_t key, void *base, const char *dtype, int64_t ndim, const int64_t *shape,
                       int writable) {
	using namespace tsk;
	try {
		Slot slot;
		if (!make_sink(base, dtype, ndim, shape, slot.sink)) {
			return -1;
		}
		slot.writable = writable != 0;
		Registry &r = registry();
		std::lock_guard<std::mutex> lock(r.mu);
		auto it = r.slots.find(key);
		if (it == r.slots.end()) {
			return -1;
		}
		it->second = std::move(slot); // moves the shape vectors: no allocation under the lock
		return 0;
	} catch (...) {
		return -1;
	}
}

int tensorsql_slot_clear(int64_t key) {
	using namespace tsk;
	try {
		Registry &r = registry();
		std::lock_guard<std::mutex> lock(r.mu);
		auto it = r.slots.find(key);
		if (it == r.slots.end()) {
			return -1;
		}
		it->second = Slot {};
		return 0;
	} catch (...) {
		return -1;
	}
}

int tensorsql_slot_free(int64_t key) {
	using namespace tsk;
	try {
		Registry &r = registry();
		std::lock_guard<std::mutex> lock(r.mu);
		return r.slots.erase(key) == 1 ? 0 : -1;
	} catch (...) {
		return -1;
	}
}
}
