// Result sinks (see sink.hpp): the registry behind the C ABI, and tensor_sink_write.
#include "sink.hpp"

#include "functions.hpp"
#include "rows.hpp"

#include <mutex>
#include <random>
#include <unordered_map>

namespace tsk {

namespace {

struct Registry {
	std::mutex mu;
	std::unordered_map<int64_t, Sink> sinks;
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
	auto it = r.sinks.find(key);
	if (it == r.sinks.end()) {
		fail(std::string(fn) + ": no result sink with key " + std::to_string(key) +
		     " (sinks are opened by tensorsql for one query)");
	}
	return it->second;
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

} // namespace tsk

extern "C" {

int64_t tensorsql_sink_open(void *base, const char *dtype, int64_t ndim, const int64_t *shape) {
	using namespace tsk;
	try {
		if (base == nullptr || dtype == nullptr || ndim < 0 || ndim > 64 || (ndim > 0 && shape == nullptr)) {
			return -1;
		}
		const DType dt = parse_dtype(Bytes {dtype, std::strlen(dtype)}, "tensorsql_sink_open"); // throws: -1
		Sink s;
		s.base = static_cast<unsigned char *>(base);
		s.dtype = dt;
		s.shape.assign(shape, shape + ndim);
		s.strides.assign(static_cast<size_t>(ndim), 1);
		uint64_t total = 1;
		for (int64_t d = ndim; d-- > 0;) {
			if (shape[d] < 0) {
				return -1;
			}
			s.strides[static_cast<size_t>(d)] = static_cast<int64_t>(total);
			if (__builtin_mul_overflow(total, static_cast<uint64_t>(shape[d]), &total) ||
			    total > (uint64_t(1) << 62) / itemsize(dt)) {
				return -1;
			}
		}
		Registry &r = registry();
		std::lock_guard<std::mutex> lock(r.mu);
		int64_t key = 0;
		while (key == 0 || r.sinks.count(key) != 0) {
			key = static_cast<int64_t>(r.rng() >> 1);
		}
		r.sinks.emplace(key, std::move(s));
		return key;
	} catch (...) {
		return -1;
	}
}

int tensorsql_sink_close(int64_t key) {
	using namespace tsk;
	try {
		Registry &r = registry();
		std::lock_guard<std::mutex> lock(r.mu);
		return r.sinks.erase(key) == 1 ? 0 : -1;
	} catch (...) {
		return -1;
	}
}
}
