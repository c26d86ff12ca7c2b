// The CUDA device: the CUDA runtime (linked statically by nvcc; it finds the driver, libcuda, at run time),
// cuBLAS for the GEMMs, and the element.hpp functions as kernels.
//
// cuBLAS is opened with dlopen when the first GEMM needs it, not linked: the extension then loads (and reports
// why it cannot run) on a machine without cuBLAS or without a driver, and builds with nvcc alone (the toolkit's
// cuBLAS headers and libraries are a separate package). The few entry points used are declared below with
// cuBLAS's documented C signatures; tensorsql preloads the library of the nvidia-cublas wheel when one is
// installed, so the soname lookup finds it.
#include "device.hpp"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#ifndef TSK_CUDA_ARCHS
#define TSK_CUDA_ARCHS "unknown"
#endif

namespace tsk {
namespace gpu {
namespace {

// ---- kernels ----------------------------------------------------------------------------------------------

constexpr int kThreads = 256;

unsigned blocks_for(uint64_t n) {
	const uint64_t b = (n + kThreads - 1) / kThreads;
	return static_cast<unsigned>(b < 65535ull * 64 ? b : 65535ull * 64);
}

template <class T, class J, class A>
__global__ void loop_kernel(const LoopJob job, const T *x, const T *y, T *z) {
	const uint64_t step = static_cast<uint64_t>(gridDim.x) * blockDim.x;
	for (uint64_t o = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; o < job.out_numel; o += step) {
		z[o] = loop_element<T, J, A>(job, x, y, o);
	}
}

// The same job with one thread block per output element: its threads split the summed index space and combine
// their partial results in shared memory (every aggregation is associative). For reductions to few outputs,
// where a thread per output would walk a long inner loop alone.
template <class T, class J, class A>
__global__ void reduce_kernel(const LoopJob job, const T *x, const T *y, T *z) {
	__shared__ alignas(16) unsigned char raw[kThreads * sizeof(T)]; // no constructor may run for __shared__
	T *part = reinterpret_cast<T *>(raw);
	for (uint64_t o = blockIdx.x; o < job.out_numel; o += gridDim.x) {
		int64_t bx = 0, by = 0;
		offsets_of(job, 0, job.n_outer, o, bx, by);
		Accumulator<T, A> acc; // a sum in CascadeSum's levels: each thread walks inner_numel / kThreads terms
		for (uint64_t t = threadIdx.x; t < job.inner_numel; t += blockDim.x) {
			int64_t ox = bx, oy = by;
			offsets_of(job, job.n_outer, job.n_inner, t, ox, oy);
			acc.add(J::template f<T>(x[ox], y == nullptr ? T(0) : y[oy]));
		}
		part[threadIdx.x] = acc.result();
		__syncthreads();
		for (unsigned half = blockDim.x / 2; half > 0; half >>= 1) {
			if (threadIdx.x < half) {
				part[threadIdx.x] = A::template f<T>(part[threadIdx.x], part[threadIdx.x + half]);
			}
			__syncthreads();
		}
		if (threadIdx.x == 0) {
			z[o] = part[0];
		}
		__syncthreads();
	}
}

// Whether a loop job reduces to few enough outputs, over enough terms each, for reduce_kernel.
bool block_per_output(const LoopJob &job) {
	return job.inner_numel >= 4 * kThreads && job.out_numel <= 65536;
}

template <class T, class M>
__global__ void map_kernel(const T *x, T *z, uint64_t n, MapParam<T> p) {
	const uint64_t step = static_cast<uint64_t>(gridDim.x) * blockDim.x;
	for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n; i += step) {
		z[i] = M::template f<T>(x[i], p);
	}
}

// ---- errors -----------------------------------------------------------------------------------------------

// Every failure also clears the thread's last-error state, so a later call on the same DuckDB thread does not
// report it again against its own work.
[[noreturn]] void cuda_fail(const char *fn, const char *what, cudaError_t e) {
	(void)cudaGetLastError();
	if (e == cudaErrorMemoryAllocation) {
		fail(std::string(fn) + ": " + kOutOfMemory + " on the CUDA device in " + what);
	}
	fail(std::string(fn) + ": CUDA error in " + what + ": " + cudaGetErrorString(e) + " (" +
	     std::to_string(static_cast<int>(e)) + ")");
}

void check(cudaError_t e, const char *fn, const char *what) {
	if (e != cudaSuccess) {
		cuda_fail(fn, what, e);
	}
}

// ---- cuBLAS, opened at run time ---------------------------------------------------------------------------

using cublasHandle_t = void *;
using cublasStatus_t = int;
constexpr int kOpN = 0;         // CUBLAS_OP_N
constexpr int kAllocFailed = 3; // CUBLAS_STATUS_ALLOC_FAILED
using CreateFn = cublasStatus_t (*)(cublasHandle_t *);
using DestroyFn = cublasStatus_t (*)(cublasHandle_t);
using SetStreamFn = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
template <class T>
using GemmFn = cublasStatus_t (*)(cublasHandle_t, int, int, int, int, int, const T *, const T *, int, long long,
                                  const T *, int, long long, const T *, T *, int, long long, int);

struct Cublas {
	void *lib = nullptr;
	std::string name;
	CreateFn create = nullptr;
	DestroyFn destroy = nullptr;
	SetStreamFn set_stream = nullptr;
	GemmFn<float> sgemm = nullptr;
	GemmFn<double> dgemm = nullptr;
	GemmFn<float2> cgemm = nullptr;  // cuComplex is float2
	GemmFn<double2> zgemm = nullptr; // cuDoubleComplex is double2

	// Opens the newest cuBLAS the soname lookup finds that has every entry point used; an error text when none.
	std::string open() {
		static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
		std::string tried;
		for (const char *n : names) {
			void *h = dlopen(n, RTLD_NOW | RTLD_LOCAL);
			if (h == nullptr) {
				continue;
			}
			create = reinterpret_cast<CreateFn>(dlsym(h, "cublasCreate_v2"));
			destroy = reinterpret_cast<DestroyFn>(dlsym(h, "cublasDestroy_v2"));
			set_stream = reinterpret_cast<SetStreamFn>(dlsym(h, "cublasSetStream_v2"));
			sgemm = reinterpret_cast<GemmFn<float>>(dlsym(h, "cublasSgemmStridedBatched"));
			dgemm = reinterpret_cast<GemmFn<double>>(dlsym(h, "cublasDgemmStridedBatched"));
			cgemm = reinterpret_cast<GemmFn<float2>>(dlsym(h, "cublasCgemmStridedBatched"));
			zgemm = reinterpret_cast<GemmFn<double2>>(dlsym(h, "cublasZgemmStridedBatched"));
			if (create && destroy && set_stream && sgemm && dgemm && cgemm && zgemm) {
				lib = h;
				name = n;
				return "";
			}
			tried += std::string(tried.empty() ? "" : ", ") + n + " lacks the strided-batched GEMM entry points";
			dlclose(h);
		}
		return tried.empty() ? "cuBLAS not found (libcublas.so.13, .so.12 or .so; install the nvidia-cublas wheel "
		                       "or put the CUDA toolkit's lib64 on LD_LIBRARY_PATH)"
		                     : tried;
	}
};

// ---- the device -------------------------------------------------------------------------------------------

class CudaDevice;

class CudaStream final : public Stream {
public:
	CudaStream(CudaDevice &dev, int ordinal, const char *fn);
	~CudaStream() override;
	void *alloc(uint64_t bytes, const char *fn, const char *what) override {
		void *p = nullptr;
		const cudaError_t e = cudaMallocAsync(&p, bytes, s_);
		if (e == cudaErrorMemoryAllocation) {
			(void)cudaGetLastError(); // not a sticky error: clear it for the thread's next call
			fail(std::string(fn) + ": " + kOutOfMemory + " on CUDA device " + std::to_string(ordinal_) +
			     " allocating " + what + " (" + std::to_string(bytes) + " bytes)");
		}
		check(e, fn, "cudaMallocAsync");
		return p;
	}
	void free(void *p) noexcept override {
		if (cudaFreeAsync(p, s_) != cudaSuccess) {
			(void)cudaGetLastError();
		}
	}
	void upload(void *dst, const void *src, uint64_t bytes) override {
		check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s_), fn_, "a host-to-device copy");
	}
	void download(void *dst, const void *src, uint64_t bytes) override {
		check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s_), fn_, "a device-to-host copy");
		check(cudaStreamSynchronize(s_), fn_, "the kernels of this call");
	}
	void zero(void *dst, uint64_t bytes) override {
		check(cudaMemsetAsync(dst, 0, bytes, s_), fn_, "cudaMemsetAsync");
	}
	void loop(DType dt, Join join, Agg agg, bool unary, const LoopJob &job, const void *x, const void *y,
	          void *z) override {
		const bool per_output = block_per_output(job);
		const unsigned blocks = per_output ? static_cast<unsigned>(job.out_numel) : blocks_for(job.out_numel);
		with_loop_type(dt, [&](auto tag) {
			using T = decltype(tag);
			with_join_agg_of<T>(join, agg, unary, [&](auto j, auto a) {
				const T *xp = static_cast<const T *>(x);
				const T *yp = static_cast<const T *>(y);
				if (per_output) {
					reduce_kernel<T, decltype(j), decltype(a)><<<blocks, kThreads, 0, s_>>>(job, xp, yp,
					                                                                      static_cast<T *>(z));
				} else {
					loop_kernel<T, decltype(j), decltype(a)><<<blocks, kThreads, 0, s_>>>(job, xp, yp,
					                                                                    static_cast<T *>(z));
				}
			});
		});
		check(cudaGetLastError(), fn_, "a loop kernel launch");
	}
	void gemm(DType dt, const GemmJob &g) override;
	void map(DType dt, Fn fn, double param, const void *x, void *z, uint64_t n) override {
		const unsigned blocks = blocks_for(n);
		with_real_type(dt, [&](auto tag) {
			using T = decltype(tag);
			MapParam<T> p;
			p.real = static_cast<T>(param);
			with_gpu_map(fn, [&](auto m) {
				map_kernel<T, decltype(m)><<<blocks, kThreads, 0, s_>>>(static_cast<const T *>(x),
				                                                        static_cast<T *>(z), n, p);
			});
		});
		check(cudaGetLastError(), fn_, "a map kernel launch");
	}

private:
	CudaDevice &dev_;
	int ordinal_;
	const char *fn_;
	cudaStream_t s_ = nullptr;
	cublasHandle_t blas_ = nullptr;
};

class CudaDevice final : public Device {
public:
	~CudaDevice() override {
		for (size_t d = 0; d < idle_.size(); d++) {
			if (idle_[d].empty() || cudaSetDevice(static_cast<int>(d)) != cudaSuccess) {
				(void)cudaGetLastError();
				continue;
			}
			for (cublasHandle_t h : idle_[d]) {
				blas_.destroy(h);
			}
		}
	}
	std::unique_ptr<Stream> stream(int ordinal, const char *fn) override {
		int count = 0;
		const cudaError_t e = cudaGetDeviceCount(&count);
		if (e != cudaSuccess) {
			(void)cudaGetLastError();
			fail(std::string(fn) + ": no usable CUDA device: " + cudaGetErrorString(e));
		}
		if (ordinal >= count) {
			fail(std::string(fn) + ": no CUDA device " + std::to_string(ordinal) + " (this machine has " +
			     std::to_string(count) + ")");
		}
		return std::make_unique<CudaStream>(*this, ordinal, fn);
	}

	// At most kCallsPerDevice kernel calls use a device at once (DuckDB runs one per thread; a call holds up to
	// six block-sized buffers, so on a many-core host unbounded calls would exhaust the device's memory, and
	// more than two in flight gain nothing: one computes while the other copies).
	static constexpr int kCallsPerDevice = 2;
	void enter(int ordinal) {
		std::unique_lock<std::mutex> lock(mu_);
		grow(ordinal);
		cv_.wait(lock, [&] { return busy_[ordinal] < kCallsPerDevice; });
		busy_[ordinal]++;
		if (!pool_set_[ordinal]) { // keep freed memory in the stream-ordered pool between calls
			pool_set_[ordinal] = true;
			cudaMemPool_t pool;
			if (cudaDeviceGetDefaultMemPool(&pool, ordinal) == cudaSuccess) {
				uint64_t keep = UINT64_MAX;
				(void)cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
			}
			(void)cudaGetLastError();
		}
	}
	void leave(int ordinal) {
		{
			std::lock_guard<std::mutex> lock(mu_);
			busy_[ordinal]--;
		}
		cv_.notify_one();
	}
	std::string describe() override {
		int count = 0;
		const cudaError_t e = cudaGetDeviceCount(&count);
		if (e != cudaSuccess) {
			(void)cudaGetLastError();
			return std::string("error: cudaGetDeviceCount: ") + cudaGetErrorString(e) + " (" +
			       std::to_string(static_cast<int>(e)) + ")";
		}
		if (count == 0) {
			return "error: the CUDA runtime sees no device";
		}
		std::string r = "cuda: " + std::to_string(count) + " device(s):";
		for (int i = 0; i < count; i++) {
			cudaDeviceProp prop;
			if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) {
				r += " " + std::to_string(i) + " " + prop.name + " (" +
				     std::to_string(prop.totalGlobalMem >> 20) + " MiB, sm_" + std::to_string(prop.major) +
				     std::to_string(prop.minor) + ");";
			}
		}
		const std::string blas = blas_error();
		r += std::string(" built for sm_") + TSK_CUDA_ARCHS + ";";
		return r + (blas.empty() ? " cublas: " + blas_.name : " cublas error: " + blas);
	}

	// cuBLAS (opened once); an error text when it cannot be used.
	std::string blas_error() {
		std::call_once(blas_once_, [this] { blas_status_ = blas_.open(); });
		return blas_status_;
	}
	const Cublas &blas() const {
		return blas_;
	}
	// A cuBLAS handle of device `ordinal` (current on this thread) for one stream; back with give_back.
	cublasHandle_t take_handle(int ordinal, const char *fn) {
		const std::string err = blas_error();
		if (!err.empty()) {
			fail(std::string(fn) + ": " + err);
		}
		{
			std::lock_guard<std::mutex> lock(mu_);
			if (static_cast<size_t>(ordinal) < idle_.size() && !idle_[ordinal].empty()) {
				cublasHandle_t h = idle_[ordinal].back();
				idle_[ordinal].pop_back();
				return h;
			}
		}
		cublasHandle_t h = nullptr;
		const cublasStatus_t st = blas_.create(&h);
		if (st == kAllocFailed) {
			fail(std::string(fn) + ": " + kOutOfMemory + " on CUDA device " + std::to_string(ordinal) +
			     " creating a cuBLAS handle");
		}
		if (st != 0) {
			fail(std::string(fn) + ": cublasCreate failed on CUDA device " + std::to_string(ordinal) +
			     " with status " + std::to_string(st));
		}
		return h;
	}
	void give_back(int ordinal, cublasHandle_t h) {
		blas_.set_stream(h, nullptr); // its stream is destroyed next
		std::lock_guard<std::mutex> lock(mu_);
		grow(ordinal);
		idle_[ordinal].push_back(h);
	}

private:
	void grow(int ordinal) { // mu_ held
		const size_t n = static_cast<size_t>(ordinal) + 1;
		if (idle_.size() < n) {
			idle_.resize(n);
			busy_.resize(n, 0);
			pool_set_.resize(n, false);
		}
	}
	std::once_flag blas_once_;
	std::string blas_status_;
	Cublas blas_;
	std::mutex mu_;
	std::condition_variable cv_;
	std::vector<std::vector<cublasHandle_t>> idle_; // per ordinal: handles no stream holds
	std::vector<int> busy_;                          // per ordinal: calls in flight
	std::vector<bool> pool_set_;                     // per ordinal: its memory pool's threshold is set
};

CudaStream::CudaStream(CudaDevice &dev, int ordinal, const char *fn) : dev_(dev), ordinal_(ordinal), fn_(fn) {
	check(cudaSetDevice(ordinal), fn, "cudaSetDevice");
	dev_.enter(ordinal);
	const cudaError_t e = cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking);
	if (e != cudaSuccess) {
		dev_.leave(ordinal);
		cuda_fail(fn, "cudaStreamCreate", e);
	}
}

CudaStream::~CudaStream() {
	(void)cudaStreamSynchronize(s_); // frees queued by a failed call complete before the stream goes
	if (blas_ != nullptr) {
		dev_.give_back(ordinal_, blas_);
	}
	(void)cudaStreamDestroy(s_);
	(void)cudaGetLastError();
	dev_.leave(ordinal_);
}

void CudaStream::gemm(DType dt, const GemmJob &g) {
	if (blas_ == nullptr) {
		blas_ = dev_.take_handle(ordinal_, fn_);
	}
	const Cublas &b = dev_.blas();
	if (b.set_stream(blas_, s_) != 0) {
		fail(std::string(fn_) + ": cublasSetStream failed");
	}
	// Row-major C = A B is column-major C^T = B^T A^T: cuBLAS multiplies B (n x k, ld n) by A (k x m, ld k).
	const int m = static_cast<int>(g.m), n = static_cast<int>(g.n), k = static_cast<int>(g.k);
	const int batch = static_cast<int>(g.batch);
	const auto call = [&](auto fn, auto one, auto zero) {
		using E = decltype(one);
		return fn(blas_, kOpN, kOpN, n, m, k, &one, static_cast<const E *>(g.b), n, 1LL * k * n,
		          static_cast<const E *>(g.a), k, 1LL * m * k, &zero, static_cast<E *>(g.c), n, 1LL * m * n, batch);
	};
	cublasStatus_t st;
	switch (dt) {
	case DType::F32:
		st = call(b.sgemm, 1.0f, 0.0f);
		break;
	case DType::F64:
		st = call(b.dgemm, 1.0, 0.0);
		break;
	case DType::C64:
		st = call(b.cgemm, make_float2(1.0f, 0.0f), make_float2(0.0f, 0.0f));
		break;
	case DType::C128:
		st = call(b.zgemm, make_double2(1.0, 0.0), make_double2(0.0, 0.0));
		break;
	default:
		fail(std::string(fn_) + ": no GEMM for dtype " + dtype_name(dt));
	}
	if (st == kAllocFailed) {
		fail(std::string(fn_) + ": " + kOutOfMemory + " on CUDA device " + std::to_string(ordinal_) +
		     " in a cuBLAS GEMM");
	}
	if (st != 0) {
		fail(std::string(fn_) + ": cuBLAS GEMM failed with status " + std::to_string(st) + " (batch " +
		     std::to_string(batch) + ", m " + std::to_string(m) + ", n " + std::to_string(n) + ", k " +
		     std::to_string(k) + ")");
	}
}

} // namespace

std::unique_ptr<Device> make_device() {
	return std::make_unique<CudaDevice>();
}

} // namespace gpu
} // namespace tsk
