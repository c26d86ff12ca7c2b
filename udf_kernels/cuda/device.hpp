// The device the GPU kernel set runs on: memory, copies, and the four kinds of work the kernels need.
//
// Two implementations: CudaDevice (device.cu: CUDA runtime, cuBLAS, the kernels of element.hpp on the GPU) and
// EmulatedDevice (emulated.cpp: host memory and the same element functions on the CPU, for testing every layer
// above on a machine without a GPU). kernels.cpp, the DuckDB functions, sees only this interface.
//
// A Device object belongs to one set of registered functions (their extra info), never to a global. A Stream is
// one kernel call's ordered queue of work (a CUDA stream): calls on different DuckDB threads never share one.
#pragma once

#include "element.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace tsk {
namespace gpu {

// The real floating types the device computes everything for; any other dtype is routed to the CPU kernels by
// the session, except complex multiply/sum contractions (device_contraction).
inline bool device_dtype(DType dt) {
	return dt == DType::F32 || dt == DType::F64;
}
inline bool device_contraction(DType dt, Join join, Agg agg) {
	return device_dtype(dt) || ((dt == DType::C64 || dt == DType::C128) && join == Join::Mul && agg == Agg::Sum);
}

// C[b] = A[b] (m x k) * B[b] (k x n) for b < batch, all row-major and contiguous, C overwritten.
struct GemmJob {
	int64_t batch = 0, m = 0, n = 0, k = 0;
	const void *a = nullptr;
	const void *b = nullptr;
	void *c = nullptr;
};

class Stream {
public:
	virtual ~Stream() = default;
	// Device memory for this call, freed by free() or with the stream; refusing it throws a KernelError that
	// carries kOutOfMemory and names fn, what and the bytes.
	virtual void *alloc(uint64_t bytes, const char *fn, const char *what) = 0;
	virtual void free(void *p) noexcept = 0;
	virtual void upload(void *dst, const void *src, uint64_t bytes) = 0;
	// Copies device bytes to the host and waits for them (and everything queued before).
	virtual void download(void *dst, const void *src, uint64_t bytes) = 0;
	virtual void zero(void *dst, uint64_t bytes) = 0;
	// z = the loop job (element.hpp) with join/agg over x (and y unless null).
	virtual void loop(DType dt, Join join, Agg agg, bool unary, const LoopJob &job, const void *x, const void *y,
	                  void *z) = 0;
	virtual void gemm(DType dt, const GemmJob &job) = 0;
	virtual void map(DType dt, Fn fn, double param, const void *x, void *z, uint64_t n) = 0;
};

class Device {
public:
	virtual ~Device() = default;
	// A stream on device `ordinal` for one kernel call; fails (KernelError) when there is no such device.
	virtual std::unique_ptr<Stream> stream(int ordinal, const char *fn) = 0;
	// What the device layer sees: "cuda: <n> device(s): ..." or why none can be used ("error: ...").
	virtual std::string describe() = 0;
};

// The build's device: CUDA where the kernel set was built with nvcc, the emulation otherwise.
std::unique_ptr<Device> make_device();

// Every dimension a GEMM is given fits cuBLAS's int arguments.
constexpr int64_t kMaxGemmDim = 0x7FFFFFFF;

} // namespace gpu
} // namespace tsk
