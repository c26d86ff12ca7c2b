// The GPU kernel set's DuckDB functions: argument reading and validation (the CPU kernels' own readers and
// checks, so a bad blob or shape fails the same way on both), the contraction plan, and the work handed to the
// device (device.hpp). Registered by the companion extension tensorsql_cuda (or its emulated build):
//
//   tensor_cuda_info()                                         -> VARCHAR  what the device layer sees
//   tensor_einsum_cuda(device, <tensor_einsum's 8 arguments>)   -> BLOB
//   tensor_einsum1_cuda(device, <tensor_einsum1's 5 arguments>) -> BLOB
//   tensor_map_cuda(device, fn, dtype, x [, param])             -> BLOB
//
// `device` is the CUDA ordinal. A tensorsql session on a GPU binds the CPU kernels' names to these with
// temporary macros (tensorsql/backends/cuda), so its SQL plans are the CPU plans, unchanged.
//
// A multiply/sum contraction is one strided-batched GEMM: each operand is packed on the device into a contiguous
// [B, M, K] / [B, K, N] copy when its layout is not that already (the same pass takes diagonals and sums the
// labels only it has), and the [B, M, N] product is permuted into Z's order when it is not Z already. Other
// joins and aggregations, unary einsums and maps run the generic loop of element.hpp. Each operand block is
// copied to the device once per call and the result block back once.
#ifndef TSK_GPU_EXTENSION_NAME
#define TSK_GPU_EXTENSION_NAME tensorsql_cuda
#endif
#define DUCKDB_EXTENSION_NAME TSK_GPU_EXTENSION_NAME

#include "device.hpp"

#include "../src/rows.hpp"

#include <initializer_list>
#include <memory>
#include <vector>

namespace tsk {
namespace gpu {
namespace {

// The host copy of a result block, grown on demand and reused across a chunk's rows, never zero-filled:
// std::vector's resize wrote every byte of a block once more (and faulted its pages in) before the download
// overwrote them.
class HostBuf {
public:
	void resize(size_t bytes) {
		if (bytes > cap_) {
			data_.reset(new unsigned char[bytes]); // default-initialised: not written
			cap_ = bytes;
		}
	}
	unsigned char *data() {
		return data_.get();
	}

private:
	std::unique_ptr<unsigned char[]> data_;
	size_t cap_ = 0;
};

// ---- registration helpers -------------------------------------------------------------------------------

duckdb_logical_type type_of(duckdb_type t) {
	if (t == DUCKDB_TYPE_LIST) {
		duckdb_logical_type child = duckdb_create_logical_type(DUCKDB_TYPE_BIGINT);
		duckdb_logical_type list = duckdb_create_list_type(child);
		duckdb_destroy_logical_type(&child);
		return list;
	}
	return duckdb_create_logical_type(t);
}

void destroy_device(void *p) {
	delete static_cast<std::shared_ptr<Device> *>(p);
}

// Registers volatile name(params) -> ret with a share of the device as extra info; BIGINT[] is written
// DUCKDB_TYPE_LIST.
bool add_function(duckdb_connection con, const char *name, std::initializer_list<duckdb_type> params,
                  duckdb_type ret, duckdb_scalar_function_t fn, const std::shared_ptr<Device> &device) {
	duckdb_scalar_function f = duckdb_create_scalar_function();
	duckdb_scalar_function_set_name(f, name);
	for (duckdb_type t : params) {
		duckdb_logical_type lt = type_of(t);
		duckdb_scalar_function_add_parameter(f, lt);
		duckdb_destroy_logical_type(&lt);
	}
	duckdb_logical_type rt = type_of(ret);
	duckdb_scalar_function_set_return_type(f, rt);
	duckdb_destroy_logical_type(&rt);
	duckdb_scalar_function_set_function(f, fn);
	duckdb_scalar_function_set_extra_info(f, new std::shared_ptr<Device>(device), destroy_device);
	duckdb_scalar_function_set_volatile(f);
	const bool ok = duckdb_register_scalar_function(con, f) == DuckDBSuccess;
	duckdb_destroy_scalar_function(&f);
	return ok;
}

Device &device_of(duckdb_function_info info) {
	return **static_cast<std::shared_ptr<Device> *>(duckdb_scalar_function_get_extra_info(info));
}

// ---- per-call helpers -----------------------------------------------------------------------------------

// The CUDA ordinal argument of a row.
int ordinal_of(const Col &c, idx_t row, const char *fn) {
	const int64_t v = c.i64(row);
	if (v < 0 || v > 1023) {
		fail(std::string(fn) + ": device ordinal " + std::to_string(v) + " is out of range");
	}
	return static_cast<int>(v);
}

void require_device_dtype(DType dt, const char *fn) {
	if (!device_dtype(dt)) {
		fail(std::string(fn) + ": dtype " + dtype_name(dt) +
		     " is not computed on the GPU (float32 and float64 are; tensorsql runs the others on the CPU kernels)");
	}
}

void require_device_contraction(DType dt, Join join, Agg agg, const char *fn) {
	if (!device_contraction(dt, join, agg)) {
		fail(std::string(fn) + ": dtype " + dtype_name(dt) + " with join '" + join_name(join) + "' and agg '" +
		     agg_name(agg) +
		     "' is not computed on the GPU (float32 and float64 are, and complex in multiply/sum contractions; "
		     "tensorsql runs the others on the CPU kernels)");
	}
}

// Device memory owned by one call: freed when it goes out of scope (before the stream is).
class Buffer {
public:
	Buffer(Stream &s, uint64_t bytes, const char *fn, const char *what)
	    : s_(s), p_(bytes == 0 ? nullptr : s.alloc(bytes, fn, what)) {
	}
	Buffer(const Buffer &) = delete;
	Buffer &operator=(const Buffer &) = delete;
	~Buffer() {
		if (p_ != nullptr) {
			s_.free(p_);
		}
	}
	void *get() const {
		return p_;
	}

private:
	Stream &s_;
	void *p_;
};

// One function call's stream (made for the first row that needs the device; rows of a chunk share it).
class CallStream {
public:
	Stream &on(Device &device, int ordinal, const char *fn) {
		if (stream_ == nullptr || ordinal_ != ordinal) {
			stream_.reset();
			stream_ = device.stream(ordinal, fn);
			ordinal_ = ordinal;
		}
		return *stream_;
	}

private:
	std::unique_ptr<Stream> stream_;
	int ordinal_ = -1;
};

LoopJob make_job(const std::vector<Loop> &outer, const std::vector<Loop> &inner) {
	LoopJob j;
	j.n_outer = static_cast<int>(outer.size());
	j.n_inner = static_cast<int>(inner.size());
	j.out_numel = 1;
	j.inner_numel = 1;
	int k = 0;
	for (const Loop &l : outer) {
		j.loops[k++] = l;
		j.out_numel *= static_cast<uint64_t>(l.size);
	}
	for (const Loop &l : inner) {
		j.loops[k++] = l;
		j.inner_numel *= static_cast<uint64_t>(l.size);
	}
	return j;
}

// Whether the loops, in order, walk a contiguous C-order array through stride sx (sizes of 1 are free).
bool contiguous(const std::vector<Loop> &loops) {
	int64_t expect = 1;
	for (size_t i = loops.size(); i-- > 0;) {
		if (loops[i].size != 1 && loops[i].sx != expect) {
			return false;
		}
		expect *= loops[i].size;
	}
	return true;
}

uint64_t product(const std::vector<Loop> &loops) {
	uint64_t n = 1;
	for (const Loop &l : loops) {
		n *= static_cast<uint64_t>(l.size);
	}
	return n;
}

// The groups' loops one after another, as a unary job over x reads them: x's strides, or y's (sy) when
// `from_y` (packing Y reads it as the job's x).
std::vector<Loop> as_x(std::initializer_list<const std::vector<Loop> *> groups, bool from_y) {
	std::vector<Loop> r;
	for (const std::vector<Loop> *g : groups) {
		for (const Loop &l : *g) {
			r.push_back(Loop {l.size, from_y ? l.sy : l.sx, 0});
		}
	}
	return r;
}

// An operand on the device in the GEMM layout [groups...] (contiguous), summing `priv`: the uploaded operand
// itself when its layout is that already, else a packed copy.
const void *packed(Stream &s, DType dt, const void *operand, const std::vector<Loop> &groups,
                   const std::vector<Loop> &priv, std::unique_ptr<Buffer> &keep, const char *fn, const char *what) {
	if (priv.empty() && contiguous(groups)) {
		return operand;
	}
	keep = std::make_unique<Buffer>(s, product(groups) * itemsize(dt), fn, what);
	s.loop(dt, Join::Mul, Agg::Sum, true, make_job(groups, priv), operand, nullptr, keep->get());
	return keep->get();
}

// z (on the device, Z's C order) = sum X * Y through one strided-batched GEMM. False (nothing done) when a
// dimension passes cuBLAS's int range; the caller then runs the generic loop.
bool gemm_contract(Stream &s, DType dt, const Plan &p, const void *x, const void *y, void *z, const char *fn) {
	enum { kB, kM, kN };
	std::vector<Loop> groups[3], px, py;
	std::vector<std::pair<int, size_t>> where; // each Z loop's group and place in it
	for (const Loop &l : p.outer) {
		const int g = l.sx != 0 && l.sy != 0 ? kB : l.sx != 0 ? kM : kN;
		where.emplace_back(g, groups[g].size());
		groups[g].push_back(l);
	}
	std::vector<Loop> kl;
	for (const Loop &l : p.inner) {
		(l.sx != 0 && l.sy != 0 ? kl : l.sx != 0 ? px : py).push_back(l);
	}
	GemmJob g;
	g.batch = static_cast<int64_t>(product(groups[kB]));
	g.m = static_cast<int64_t>(product(groups[kM]));
	g.n = static_cast<int64_t>(product(groups[kN]));
	g.k = static_cast<int64_t>(product(kl));
	if (g.batch > kMaxGemmDim || g.m > kMaxGemmDim || g.n > kMaxGemmDim || g.k > kMaxGemmDim) {
		return false;
	}
	// A = [B, M, K] read from x, B = [B, K, N] read from y
	const std::vector<Loop> a_groups = as_x({&groups[kB], &groups[kM], &kl}, false);
	const std::vector<Loop> b_groups = as_x({&groups[kB], &kl, &groups[kN]}, true);
	std::unique_ptr<Buffer> a_keep, b_keep;
	g.a = packed(s, dt, x, a_groups, as_x({&px}, false), a_keep, fn, "operand x in the GEMM layout");
	g.b = packed(s, dt, y, b_groups, as_x({&py}, true), b_keep, fn, "operand y in the GEMM layout");
	// Z's loops with their strides in C = [B, M, N]: C is Z when those are Z's own contiguous strides.
	const int64_t base[3] = {g.m * g.n, g.n, 1};
	std::vector<Loop> z_in_c;
	for (size_t i = 0; i < p.outer.size(); i++) {
		const auto [grp, idx] = where[i];
		int64_t stride = base[grp];
		for (size_t k = idx + 1; k < groups[grp].size(); k++) {
			stride *= groups[grp][k].size;
		}
		z_in_c.push_back(Loop {p.outer[i].size, stride, 0});
	}
	if (contiguous(z_in_c)) {
		g.c = z;
		s.gemm(dt, g);
		return true;
	}
	Buffer c(s, static_cast<uint64_t>(g.batch * g.m * g.n) * itemsize(dt), fn, "the GEMM result");
	g.c = c.get();
	s.gemm(dt, g);
	s.loop(dt, Join::Mul, Agg::Sum, true, make_job(z_in_c, {}), c.get(), nullptr, z);
	return true;
}

bool any_empty(const std::vector<Loop> &loops) {
	for (const Loop &l : loops) {
		if (l.size == 0) {
			return true;
		}
	}
	return false;
}

// ---- the functions --------------------------------------------------------------------------------------

void tensor_cuda_info(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensor_cuda_info";
	guard_scalar(info, FN, [&] {
		const std::string text = device_of(info).describe();
		const idx_t count = duckdb_data_chunk_get_size(input);
		for (idx_t row = 0; row < count; row++) {
			duckdb_vector_assign_string_element_len(output, row, text.data(), text.size());
		}
	});
}

void tensor_einsum_cuda(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensor_einsum_cuda";
	guard_scalar(info, FN, [&] {
		Col dev_c(input, 0), spec_c(input, 1), join_c(input, 2), agg_c(input, 3);
		DTypeCol dtype_c(input, 4);
		BlockCol x(input, 5, 6, "x"), y(input, 7, 8, "y");
		Cached<Spec> specs;
		Cached<Join> joins;
		Cached<Agg> aggs;
		CallStream stream;
		HostBuf host;
		static const char *const names[] = {"x", "y"};
		scalar_rows(input, output, all_valid(dev_c, spec_c, join_c, agg_c, dtype_c, x, y), [&](idx_t row) {
			const int ordinal = ordinal_of(dev_c, row, FN);
			const Spec &spec = specs.get(spec_c.str(row), [](const Bytes &b) { return parse_spec(b, 2, FN); });
			const Join join = joins.get(join_c.str(row), [](const Bytes &b) { return parse_join(b, FN); });
			const Agg agg = aggs.get(agg_c.str(row), [](const Bytes &b) { return parse_agg(b, FN); });
			const DType dt = dtype_c.get(row, FN);
			require_device_contraction(dt, join, agg, FN);
			x.read(row, dt, FN);
			y.read(row, dt, FN);
			const Shape *shapes[] = {&x.shape, &y.shape};
			const Plan p = make_plan(spec, shapes, names, itemsize(dt), FN);
			check_empty_reduction(p, agg, dt, FN);
			const uint64_t out_bytes = p.out_numel * itemsize(dt);
			host.resize(out_bytes);
			if (out_bytes != 0) {
				Stream &s = stream.on(device_of(info), ordinal, FN);
				Buffer xd(s, x.bytes.size, FN, "operand x"), yd(s, y.bytes.size, FN, "operand y");
				Buffer zd(s, out_bytes, FN, "the output block");
				s.upload(xd.get(), x.bytes.data, x.bytes.size);
				s.upload(yd.get(), y.bytes.data, y.bytes.size);
				// nothing summed (an element-wise product): the loop, which keeps a -0.0 product's sign (a GEMM
				// of k = 1 adds it to 0)
				const bool gemm = join == Join::Mul && agg == Agg::Sum && !p.inner.empty();
				if (gemm && any_empty(p.inner)) {
					s.zero(zd.get(), out_bytes); // a sum over an empty label
				} else if (!gemm || !gemm_contract(s, dt, p, xd.get(), yd.get(), zd.get(), FN)) {
					s.loop(dt, join, agg, false, make_job(p.outer, p.inner), xd.get(), yd.get(), zd.get());
				}
				s.download(host.data(), zd.get(), out_bytes);
			}
			set_blob(output, row, host.data(), out_bytes);
		});
	});
}

void tensor_einsum1_cuda(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	static constexpr const char *FN = "tensor_einsum1_cuda";
	guard_scalar(info, FN, [&] {
		Col dev_c(input, 0), spec_c(input, 1), agg_c(input, 2);
		DTypeCol dtype_c(input, 3);
		BlockCol x(input, 4, 5, "x");
		Cached<Spec> specs;
		Cached<Agg> aggs;
		CallStream stream;
		HostBuf host;
		static const char *const names[] = {"x", "y"};
		scalar_rows(input, output, all_valid(dev_c, spec_c, agg_c, dtype_c, x), [&](idx_t row) {
			const int ordinal = ordinal_of(dev_c, row, FN);
			const Spec &spec = specs.get(spec_c.str(row), [](const Bytes &b) { return parse_spec(b, 1, FN); });
			const Agg agg = aggs.get(agg_c.str(row), [](const Bytes &b) { return parse_agg(b, FN); });
			const DType dt = dtype_c.get(row, FN);
			require_device_dtype(dt, FN);
			x.read(row, dt, FN);
			const Shape *shapes[] = {&x.shape, nullptr};
			const Plan p = make_plan(spec, shapes, names, itemsize(dt), FN);
			check_empty_reduction(p, agg, dt, FN);
			const uint64_t out_bytes = p.out_numel * itemsize(dt);
			host.resize(out_bytes);
			if (out_bytes != 0) {
				Stream &s = stream.on(device_of(info), ordinal, FN);
				Buffer xd(s, x.bytes.size, FN, "operand x"), zd(s, out_bytes, FN, "the output block");
				s.upload(xd.get(), x.bytes.data, x.bytes.size);
				s.loop(dt, Join::Mul, agg, true, make_job(p.outer, p.inner), xd.get(), nullptr, zd.get());
				s.download(host.data(), zd.get(), out_bytes);
			}
			set_blob(output, row, host.data(), out_bytes);
		});
	});
}

void map_rows(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output, bool with_param) {
	static constexpr const char *FN = "tensor_map_cuda";
	guard_scalar(info, FN, [&] {
		Col dev_c(input, 0), fn_c(input, 1);
		DTypeCol dtype_c(input, 2);
		BlobCol x(input, 3);
		Col param_c = with_param ? Col(input, 4) : Col(input, 0);
		Cached<Fn> fns;
		CallStream stream;
		HostBuf host;
		const auto args_valid = all_valid(dev_c, fn_c, dtype_c, x);
		auto valid = [&](idx_t row) { return args_valid(row) && (!with_param || param_c.valid(row)); };
		scalar_rows(input, output, valid, [&](idx_t row) {
			const int ordinal = ordinal_of(dev_c, row, FN);
			const Fn f = fns.get(fn_c.str(row), [](const Bytes &b) { return parse_fn(b, FN); });
			const bool needs_param = with_map(f, [](auto tag) { return (decltype(tag)::kFlags & kMapParam) != 0; });
			if (needs_param && !with_param) {
				fail(std::string(FN) + ": fn '" + fn_name(f) + "' needs a param (call tensor_map(fn, dtype, x, param))");
			}
			const DType dt = dtype_c.get(row, FN);
			require_device_dtype(dt, FN);
			const uint64_t n = x.read(row, dt, FN);
			const uint64_t bytes = n * itemsize(dt);
			host.resize(bytes);
			if (bytes != 0) {
				Stream &s = stream.on(device_of(info), ordinal, FN);
				Buffer xd(s, bytes, FN, "operand x"), zd(s, bytes, FN, "the output block");
				s.upload(xd.get(), x.bytes.data, bytes);
				s.map(dt, f, with_param ? param_c.f64(row) : 0.0, xd.get(), zd.get(), n);
				s.download(host.data(), zd.get(), bytes);
			}
			set_blob(output, row, host.data(), bytes);
		});
	});
}

void tensor_map_cuda(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	map_rows(info, input, output, false);
}

void tensor_map_param_cuda(duckdb_function_info info, duckdb_data_chunk input, duckdb_vector output) {
	map_rows(info, input, output, true);
}

bool register_all(duckdb_connection con) {
	const std::shared_ptr<Device> device(make_device().release());
	constexpr duckdb_type V = DUCKDB_TYPE_VARCHAR, B = DUCKDB_TYPE_BLOB, L = DUCKDB_TYPE_LIST,
	                      I = DUCKDB_TYPE_BIGINT, D = DUCKDB_TYPE_DOUBLE;
	// Volatile, all of them: DuckDB then never evaluates a call twice. Deterministic functions it may copy into a
	// pushed-down filter (a statement's "NOT tensor IS NULL" over its padding rows ran every block product twice).
	bool ok = add_function(con, "tensor_cuda_info", {}, V, tensor_cuda_info, device);
	ok = ok && add_function(con, "tensor_einsum_cuda", {I, V, V, V, V, B, L, B, L}, B, tensor_einsum_cuda, device);
	ok = ok && add_function(con, "tensor_einsum1_cuda", {I, V, V, V, B, L}, B, tensor_einsum1_cuda, device);
	ok = ok && add_function(con, "tensor_map_cuda", {I, V, V, B}, B, tensor_map_cuda, device);
	ok = ok && add_function(con, "tensor_map_param_cuda", {I, V, V, B, D}, B, tensor_map_param_cuda, device);
	return ok;
}

} // namespace
} // namespace gpu
} // namespace tsk

DUCKDB_EXTENSION_ENTRYPOINT(duckdb_connection connection, duckdb_extension_info info,
                            struct duckdb_extension_access *access) {
	try {
		if (!tsk::gpu::register_all(connection)) {
			access->set_error(info, "tensorsql_cuda: failed to register a function");
			return false;
		}
		return true;
	} catch (...) {
		access->set_error(info, "tensorsql_cuda: internal error during registration");
		return false;
	}
}
