// Block layout functions: zeros, slice, sizes, checks, list conversion, element access, version.
#include "dtype.hpp"
#include "functions.hpp"
#include "rows.hpp"
#include "values.hpp"

namespace tsk {

void copy_region(unsigned char *dst, const Shape &dst_shape, const Shape &dst_off, const unsigned char *src,
                 const Shape &src_shape, const Shape &src_off, const Shape &region, size_t itemsize) {
	const size_t r = region.size();
	if (r == 0) {
		std::memcpy(dst, src, itemsize);
		return;
	}
	for (int64_t d : region) {
		if (d == 0) {
			return;
		}
	}
	// Element strides (C order) of both blocks.
	std::vector<int64_t> ds(r), ss(r);
	int64_t a = 1, b = 1;
	for (size_t k = r; k-- > 0;) {
		ds[k] = a;
		ss[k] = b;
		a *= dst_shape[k];
		b *= src_shape[k];
	}
	int64_t dpos = 0, spos = 0;
	for (size_t k = 0; k < r; k++) {
		dpos += dst_off[k] * ds[k];
		spos += src_off[k] * ss[k];
	}
	const size_t run = static_cast<size_t>(region[r - 1]) * itemsize; // innermost dimension is contiguous
	std::vector<int64_t> idx(r, 0);
	while (true) {
		std::memcpy(dst + static_cast<size_t>(dpos) * itemsize, src + static_cast<size_t>(spos) * itemsize, run);
		size_t k = r - 1;
		while (true) {
			if (k == 0) {
				return;
			}
			--k;
			dpos += ds[k];
			spos += ss[k];
			if (++idx[k] < region[k]) {
				break;
			}
			dpos -= ds[k] * region[k];
			spos -= ss[k] * region[k];
			idx[k] = 0;
		}
	}
}

void tensor_zeros(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensor_zeros";
	guard_scalar(info, FN, [&] {
		DTypeCol dtype_c(input, 0);
		ListCol shape_c(input, 1);
		Shape shape;
		MemoryBudget *mem = memory_of_info(duckdb_scalar_function_get_extra_info(info));
		AlignedBuf zb(mem, FN, "the zero block");
		CallCharge charged(mem, FN);
		scalar_rows(input, output, all_valid(dtype_c, shape_c), [&](idx_t row) {
			const DType dt = dtype_c.get(row, FN);
			shape_c.get(row, shape, FN, "shape");
			const size_t bytes = checked_numel(shape, itemsize(dt), FN, "shape") * itemsize(dt);
			unsigned char *z = zb.zeros(bytes);
			charged.add(bytes, "the result blobs of a chunk");
			set_blob(output, row, z, bytes);
		});
	});
}

void tensor_slice(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensor_slice";
	guard_scalar(info, FN, [&] {
		DTypeCol dtype_c(input, 0);
		BlockCol x(input, 1, 2, "x");
		ListCol start_c(input, 3), stop_c(input, 4);
		Shape start, stop, region, zero_off;
		MemoryBudget *mem = memory_of_info(duckdb_scalar_function_get_extra_info(info));
		AlignedBuf zb(mem, FN, "the slice");
		CallCharge charged(mem, FN);
		scalar_rows(input, output, all_valid(dtype_c, x, start_c, stop_c), [&](idx_t row) {
			const DType dt = dtype_c.get(row, FN);
			x.read(row, dt, FN);
			const Shape &xs = x.shape;
			start_c.get(row, start, FN, "start");
			stop_c.get(row, stop, FN, "stop");
			if (start.size() != xs.size() || stop.size() != xs.size()) {
				fail(std::string(FN) + ": start " + shape_str(start) + " and stop " + shape_str(stop) +
				     " must both have the rank of x_shape " + shape_str(xs));
			}
			region.resize(xs.size());
			for (size_t k = 0; k < xs.size(); k++) {
				if (start[k] < 0 || start[k] > stop[k] || stop[k] > xs[k]) {
					fail(std::string(FN) + ": slice " + shape_str(start) + ":" + shape_str(stop) +
					     " is out of bounds for x_shape " + shape_str(xs) + " (dim " + std::to_string(k) +
					     " needs 0 <= start <= stop <= " + std::to_string(xs[k]) + ")");
				}
				region[k] = stop[k] - start[k];
			}
			zero_off.assign(xs.size(), 0);
			const size_t bytes = checked_numel(region, itemsize(dt), FN, "slice") * itemsize(dt);
			unsigned char *z = zb.resize(bytes);
			if (bytes) {
				copy_region(z, region, zero_off, x.bytes.udata(), xs, start, region, itemsize(dt));
			}
			charged.add(bytes, "the result blobs of a chunk");
			set_blob(output, row, z, bytes);
		});
	});
}

// x[start::step] per dimension, count elements each (numpy basic slicing with any non-zero step; the caller
// resolves negative and open bounds). Every element read is checked to lie inside x before any is copied.
uint64_t slice_bytes(DType dt, const Shape &xs, const Shape &start, const Shape &count, const Shape &step,
                     const char *fn) {
	const size_t r = xs.size();
	if (start.size() != r || count.size() != r || step.size() != r) {
		fail(std::string(fn) + ": start " + shape_str(start) + ", count " + shape_str(count) + " and step " +
		     shape_str(step) + " must all have the rank of x_shape " + shape_str(xs));
	}
	for (size_t k = 0; k < r; k++) {
		const std::string dim = " (dim " + std::to_string(k) + ")";
		if (count[k] < 0 || step[k] == 0) {
			fail(std::string(fn) + ": count " + std::to_string(count[k]) + " and step " + std::to_string(step[k]) +
			     dim + " need count >= 0 and step != 0");
		}
		if (count[k] == 0) {
			continue;
		}
		// the first element and the room left after it, in the step's direction: (count - 1) steps must fit
		// (a division, so no product can overflow)
		bool inside = start[k] >= 0 && start[k] < xs[k];
		if (inside && count[k] > 1) {
			const int64_t room = step[k] > 0 ? xs[k] - 1 - start[k] : start[k];
			const int64_t stride = step[k] > 0 ? step[k] : (step[k] == INT64_MIN ? INT64_MAX : -step[k]);
			inside = step[k] != INT64_MIN && count[k] - 1 <= room / stride;
		}
		if (!inside) {
			fail(std::string(fn) + ": start " + std::to_string(start[k]) + ", count " + std::to_string(count[k]) +
			     ", step " + std::to_string(step[k]) + " reads outside x_shape " + shape_str(xs) + dim);
		}
	}
	const size_t isz = itemsize(dt);
	return checked_numel(count, isz, fn, "count") * isz;
}

void slice_values(DType dt, const Shape &xs, const Shape &start, const Shape &count, const Shape &step,
                  const unsigned char *src, unsigned char *z) {
	const size_t r = xs.size();
	const size_t isz = itemsize(dt);
	for (int64_t c : count) {
		if (c == 0) {
			return;
		}
	}
	if (r == 0) {
		std::memcpy(z, src, isz);
		return;
	}
	std::vector<int64_t> strides(r, 1);
	for (size_t k = r; k-- > 1;) {
		strides[k - 1] = strides[k] * xs[k];
	}
	int64_t pos = 0; // element offset in x of the current output element
	for (size_t k = 0; k < r; k++) {
		pos += start[k] * strides[k];
	}
	Shape idx(r, 0);
	const int64_t inner_step = count[r - 1] > 1 ? step[r - 1] * strides[r - 1] : 0;
	const int64_t inner = count[r - 1];
	unsigned char *out = z;
	// the next output row's position: the odometer over the outer dimensions (false when done)
	auto advance = [&]() {
		for (size_t k = r - 1; k-- > 0;) {
			if (count[k] == 1) {
				continue; // never advances (and its step may be any int64: no product formed)
			}
			pos += step[k] * strides[k];
			if (++idx[k] < count[k]) {
				return true;
			}
			pos -= step[k] * strides[k] * count[k];
			idx[k] = 0;
		}
		return false;
	};
	do {
		if (step[r - 1] == 1) {
			std::memcpy(out, src + static_cast<size_t>(pos) * isz, static_cast<size_t>(inner) * isz);
			out += static_cast<size_t>(inner) * isz;
		} else {
			int64_t p = pos;
			for (int64_t t = 0; t < inner; t++, p += inner_step) {
				std::memcpy(out, src + static_cast<size_t>(p) * isz, isz);
				out += isz;
			}
		}
	} while (advance());
}

void tensor_slice_strided(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensor_slice_strided";
	guard_scalar(info, FN, [&] {
		DTypeCol dtype_c(input, 0);
		BlockCol x(input, 1, 2, "x");
		ListCol start_c(input, 3), count_c(input, 4), step_c(input, 5);
		Shape start, count, step;
		MemoryBudget *mem = memory_of_info(duckdb_scalar_function_get_extra_info(info));
		AlignedBuf zb(mem, FN, "the slice");
		CallCharge charged(mem, FN);
		scalar_rows(input, output, all_valid(dtype_c, x, start_c, count_c, step_c), [&](idx_t row) {
			const DType dt = dtype_c.get(row, FN);
			x.read(row, dt, FN);
			start_c.get(row, start, FN, "start");
			count_c.get(row, count, FN, "count");
			step_c.get(row, step, FN, "step");
			const uint64_t bytes = slice_bytes(dt, x.shape, start, count, step, FN);
			unsigned char *z = zb.resize(bytes);
			if (bytes) {
				slice_values(dt, x.shape, start, count, step, x.bytes.udata(), z);
			}
			charged.add(bytes, "the result blobs of a chunk");
			set_blob(output, row, z, bytes);
		});
	});
}

void tensor_numel(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensor_numel";
	guard_scalar(info, FN, [&] {
		BlobCol x(input, 0);
		DTypeCol dtype_c(input, 1);
		int64_t *out = static_cast<int64_t *>(duckdb_vector_get_data(output));
		scalar_rows(input, output, all_valid(x, dtype_c), [&](idx_t row) {
			out[row] = static_cast<int64_t>(x.read(row, dtype_c.get(row, FN), FN));
		});
	});
}

void tensor_itemsize(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensor_itemsize";
	guard_scalar(info, FN, [&] {
		DTypeCol dtype_c(input, 0);
		int32_t *out = static_cast<int32_t *>(duckdb_vector_get_data(output));
		scalar_rows(input, output, all_valid(dtype_c), [&](idx_t row) {
			out[row] = static_cast<int32_t>(itemsize(dtype_c.get(row, FN)));
		});
	});
}

void tensor_check(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensor_check";
	guard_scalar(info, FN, [&] {
		BlobCol x(input, 0);
		DTypeCol dtype_c(input, 1);
		ListCol shape_c(input, 2);
		Shape shape;
		bool *out = static_cast<bool *>(duckdb_vector_get_data(output));
		scalar_rows(input, output, all_valid(x, dtype_c, shape_c), [&](idx_t row) {
			const DType dt = dtype_c.get(row, FN);
			shape_c.get(row, shape, FN, "shape");
			bool ok = true;
			uint64_t need = itemsize(dt);
			for (int64_t d : shape) {
				if (d < 0 || __builtin_mul_overflow(need, static_cast<uint64_t>(d), &need)) {
					ok = false;
					break;
				}
			}
			out[row] = ok && need == x.raw(row).size; // the question itself: no validation of x
		});
	});
}

namespace {

// The SQL list types a block converts to exactly: tensor_to_list (DOUBLE[]: the floats, and the integers of at
// most 32 bits), tensor_to_bigint_list (BIGINT[]: every signed integer, and the unsigned ones of at most 32 bits)
// and tensor_to_ubigint_list (UBIGINT[]: the unsigned integers). A DuckDB function has one return type whatever
// its dtype argument says, so each list type is its own function, and each refuses a dtype some of whose
// values it would change (int64 in DOUBLE[] would round 2**53 + 1) with the name of the one that fits.
template <class L>
struct ListKind;
template <>
struct ListKind<double> {
	static constexpr const char *kFn = "tensor_to_list";
	static constexpr const char *kType = "DOUBLE[]";
	static bool exact(DType d) {
		return !is_complex_dtype(d) && (!is_integer_dtype(d) || itemsize(d) <= 4);
	}
};
template <>
struct ListKind<int64_t> {
	static constexpr const char *kFn = "tensor_to_bigint_list";
	static constexpr const char *kType = "BIGINT[]";
	static bool exact(DType d) {
		return is_integer_dtype(d) && d != DType::U64;
	}
};
template <>
struct ListKind<uint64_t> {
	static constexpr const char *kFn = "tensor_to_ubigint_list";
	static constexpr const char *kType = "UBIGINT[]";
	static bool exact(DType d) {
		return d == DType::U8 || d == DType::U16 || d == DType::U32 || d == DType::U64;
	}
};

// The list function that converts dtype d exactly (the first that does).
const char *exact_list_function(DType d) {
	if (ListKind<double>::exact(d)) {
		return ListKind<double>::kFn;
	}
	return ListKind<int64_t>::exact(d) ? ListKind<int64_t>::kFn : ListKind<uint64_t>::kFn;
}

template <class L>
void check_list_dtype(const char *fn, DType dt, const char *what) {
	if (is_complex_dtype(dt)) {
		fail(std::string(fn) + ": dtype " + dtype_name(dt) + " is complex; only real dtypes " + what);
	}
	if (!ListKind<L>::exact(dt)) {
		fail(std::string(fn) + ": dtype " + dtype_name(dt) + " does not convert exactly to " + ListKind<L>::kType +
		     "; use " + exact_list_function(dt) + "(x, '" + dtype_name(dt) + "')");
	}
}

template <class L>
void to_list(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	const char *FN = ListKind<L>::kFn;
	guard_scalar(info, FN, [&] {
		BlobCol x(input, 0);
		DTypeCol dtype_c(input, 1);
		auto *entries = static_cast<duckdb_list_entry *>(duckdb_vector_get_data(output));
		auto on_null = [&](idx_t row) {
			entries[row] = duckdb_list_entry {duckdb_list_vector_get_size(output), 0};
			set_null(output, row);
		};
		for_each_row(input, all_valid(x, dtype_c), [&](idx_t row) {
			const idx_t offset = duckdb_list_vector_get_size(output);
			const DType dt = dtype_c.get(row, FN);
			check_list_dtype<L>(FN, dt, "convert to a list");
			const uint64_t n = x.read(row, dt, FN);
			if (duckdb_list_vector_reserve(output, offset + n) != DuckDBSuccess) {
				fail(std::string(FN) + ": could not reserve " + std::to_string(n) + " list elements");
			}
			L *child = static_cast<L *>(duckdb_vector_get_data(duckdb_list_vector_get_child(output)));
			dispatch(dt, [&](auto tag) {
				using T = typename decltype(tag)::type;
				if constexpr (!is_complex_v<T>) {
					for (uint64_t i = 0; i < n; i++) {
						child[offset + i] = static_cast<L>(load<T>(x.bytes.udata() + i * sizeof(T)));
					}
				}
			});
			duckdb_list_vector_set_size(output, offset + n);
			entries[row] = duckdb_list_entry {offset, n};
		}, on_null);
	});
}

// tensor_from_list over a list of L (DOUBLE[], BIGINT[] or UBIGINT[]): each value converted as numpy's astype.
template <class L>
void from_list(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensor_from_list";
	guard_scalar(info, FN, [&] {
		ListCol values_c(input, 0);
		DTypeCol dtype_c(input, 1);
		std::vector<L> values;
		AlignedBuf zb;
		scalar_rows(input, output, all_valid(values_c, dtype_c), [&](idx_t row) {
			const DType dt = dtype_c.get(row, FN);
			if (is_complex_dtype(dt)) {
				fail(std::string(FN) + ": dtype " + dtype_name(dt) + " is complex; only real dtypes are built from lists");
			}
			values_c.get(row, values, FN, "values");
			const size_t bytes = values.size() * itemsize(dt);
			if (bytes > kMaxBlobBytes) {
				fail(std::string(FN) + ": " + std::to_string(values.size()) + " values exceed the block limit");
			}
			unsigned char *z = zb.resize(bytes);
			dispatch(dt, [&](auto tag) {
				using T = typename decltype(tag)::type;
				for (size_t i = 0; i < values.size(); i++) {
					store<T>(z + i * sizeof(T), convert<T>(values[i]));
				}
			});
			set_blob(output, row, z, bytes);
		});
	});
}

} // namespace

void tensor_to_list(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	to_list<double>(info, input, output);
}

void tensor_to_bigint_list(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	to_list<int64_t>(info, input, output);
}

void tensor_to_ubigint_list(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	to_list<uint64_t>(info, input, output);
}

void tensor_from_list(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	from_list<double>(info, input, output);
}

void tensor_from_bigint_list(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	from_list<int64_t>(info, input, output);
}

void tensor_from_ubigint_list(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	from_list<uint64_t>(info, input, output);
}

void tensor_get(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensor_get";
	guard_scalar(info, FN, [&] {
		BlockCol x(input, 0, 2, "x", "shape");
		DTypeCol dtype_c(input, 1);
		ListCol index_c(input, 3);
		Shape index;
		double *out = static_cast<double *>(duckdb_vector_get_data(output));
		scalar_rows(input, output, all_valid(x, dtype_c, index_c), [&](idx_t row) {
			const DType dt = dtype_c.get(row, FN);
			check_list_dtype<double>(FN, dt, "return a DOUBLE");
			x.read(row, dt, FN);
			const Shape &shape = x.shape;
			index_c.get(row, index, FN, "index");
			if (index.size() != shape.size()) {
				fail(std::string(FN) + ": index " + shape_str(index) + " does not have the rank of shape " +
				     shape_str(shape));
			}
			uint64_t flat = 0;
			for (size_t k = 0; k < shape.size(); k++) {
				if (index[k] < 0 || index[k] >= shape[k]) {
					fail(std::string(FN) + ": index " + shape_str(index) + " is out of bounds for shape " +
					     shape_str(shape));
				}
				flat = flat * static_cast<uint64_t>(shape[k]) + static_cast<uint64_t>(index[k]);
			}
			dispatch(dt, [&](auto tag) {
				using T = typename decltype(tag)::type;
				if constexpr (!is_complex_v<T>) {
					out[row] = static_cast<double>(load<T>(x.bytes.udata() + flat * sizeof(T)));
				}
			});
		});
	});
}

// A volatile identity on BIGINT[]. DuckDB pulls deterministic projections up through joins; a volatile one
// stays where it is written, so a join side that computes its block shapes with tensor_pin carries a LIST
// column through the join. DuckDB does not buffer join outputs holding a LIST (its caching of outputs under
// 64 rows would copy every blob of every joined pair).
void tensor_pin(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	guard_scalar(info, "tensor_pin", [&] {
		const idx_t count = duckdb_data_chunk_get_size(input);
		duckdb_vector in = duckdb_data_chunk_get_vector(input, 0);
		const Col outer(in);
		const auto *src = static_cast<const duckdb_list_entry *>(duckdb_vector_get_data(in));
		duckdb_vector in_child = duckdb_list_vector_get_child(in);
		const auto *in_vals = static_cast<const int64_t *>(duckdb_vector_get_data(in_child));
		uint64_t *in_valid = duckdb_vector_get_validity(in_child);
		idx_t total = 0;
		for (idx_t row = 0; row < count; row++) {
			total += outer.valid(row) ? src[row].length : 0;
		}
		if (duckdb_list_vector_reserve(output, total) != DuckDBSuccess) {
			fail("tensor_pin: could not reserve " + std::to_string(total) + " list elements");
		}
		duckdb_vector out_child = duckdb_list_vector_get_child(output);
		auto *out_vals = static_cast<int64_t *>(duckdb_vector_get_data(out_child));
		auto *entries = static_cast<duckdb_list_entry *>(duckdb_vector_get_data(output));
		idx_t at = 0;
		for (idx_t row = 0; row < count; row++) {
			if (!outer.valid(row)) {
				entries[row] = duckdb_list_entry {at, 0};
				set_null(output, row);
				continue;
			}
			const duckdb_list_entry e = src[row];
			for (idx_t k = 0; k < e.length; k++) {
				out_vals[at + k] = in_vals[e.offset + k];
				if (in_valid != nullptr && !duckdb_validity_row_is_valid(in_valid, e.offset + k)) {
					duckdb_vector_ensure_validity_writable(out_child);
					duckdb_validity_set_row_invalid(duckdb_vector_get_validity(out_child), at + k);
				}
			}
			entries[row] = duckdb_list_entry {at, e.length};
			at += e.length;
		}
		duckdb_list_vector_set_size(output, at);
	});
}

void tensorsql_kernels_version(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	guard_scalar(info, "tensorsql_kernels_version", [&] {
		const idx_t count = duckdb_data_chunk_get_size(input);
		for (idx_t row = 0; row < count; row++) {
			duckdb_vector_assign_string_element(output, row, TENSORSQL_KERNELS_VERSION);
		}
	});
}

} // namespace tsk
