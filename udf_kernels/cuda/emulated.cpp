// The emulated device: host memory, and the element functions of element.hpp run on the CPU over the same index
// spaces as the CUDA kernels. Built as tensorsql_cuda_emulated (g++ only, no CUDA) so that the GPU kernel set's
// DuckDB functions, its contraction planning and GEMM packing, and the session's GPU executor are tested on
// every machine; the GEMM here has cuBLAS's contract (row-major C[b] = A[b] B[b], C overwritten) as a plain loop.
//
// It also counts what a real device would move: tensor_cuda_info() reports the bytes uploaded and downloaded and
// the kernel launches, so tests can check the copy discipline (each operand once per call, each result once).
#include "device.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

namespace tsk {
namespace gpu {
namespace {

struct Counters {
	std::atomic<uint64_t> uploaded {0}, downloaded {0}, launches {0}, live_bytes {0};
	// The emulated device's memory: TENSORSQL_EMULATED_DEVICE_BYTES when the extension loads (tests of the
	// out-of-memory path), else unbounded.
	uint64_t capacity = UINT64_MAX;
};

uint64_t capacity_from_env() {
	const char *v = std::getenv("TENSORSQL_EMULATED_DEVICE_BYTES");
	if (v == nullptr || *v == '\0') {
		return UINT64_MAX;
	}
	char *end = nullptr;
	const unsigned long long n = std::strtoull(v, &end, 10);
	return end != nullptr && *end == '\0' ? static_cast<uint64_t>(n) : UINT64_MAX;
}

class EmulatedStream final : public Stream {
public:
	explicit EmulatedStream(Counters &c) : c_(c) {
	}
	void *alloc(uint64_t bytes, const char *fn, const char *what) override {
		const uint64_t live = c_.live_bytes.fetch_add(bytes) + bytes;
		void *p = live > c_.capacity ? nullptr : std::malloc(bytes + sizeof(uint64_t));
		if (p == nullptr) {
			c_.live_bytes -= bytes;
			fail(std::string(fn) + ": " + kOutOfMemory + " on the device allocating " + what + " (" +
			     std::to_string(bytes) + " bytes)");
		}
		std::memcpy(p, &bytes, sizeof(uint64_t));
		return static_cast<unsigned char *>(p) + sizeof(uint64_t);
	}
	void free(void *p) noexcept override {
		unsigned char *base = static_cast<unsigned char *>(p) - sizeof(uint64_t);
		uint64_t bytes = 0;
		std::memcpy(&bytes, base, sizeof(uint64_t));
		c_.live_bytes -= bytes;
		std::free(base);
	}
	void upload(void *dst, const void *src, uint64_t bytes) override {
		std::memcpy(dst, src, bytes);
		c_.uploaded += bytes;
	}
	void download(void *dst, const void *src, uint64_t bytes) override {
		std::memcpy(dst, src, bytes);
		c_.downloaded += bytes;
	}
	void zero(void *dst, uint64_t bytes) override {
		std::memset(dst, 0, bytes);
		c_.launches++;
	}
	void loop(DType dt, Join join, Agg agg, bool unary, const LoopJob &job, const void *x, const void *y,
	          void *z) override {
		c_.launches++;
		with_loop_type(dt, [&](auto tag) {
			using T = decltype(tag);
			with_join_agg_of<T>(join, agg, unary, [&](auto j, auto a) {
				using J = decltype(j);
				using A = decltype(a);
				const T *xp = static_cast<const T *>(x);
				const T *yp = static_cast<const T *>(y);
				T *zp = static_cast<T *>(z);
				for (uint64_t o = 0; o < job.out_numel; o++) {
					zp[o] = loop_element<T, J, A>(job, xp, yp, o);
				}
			});
		});
	}
	void gemm(DType dt, const GemmJob &g) override {
		c_.launches++;
		with_loop_type(dt, [&](auto tag) {
			using T = decltype(tag);
			const T *a = static_cast<const T *>(g.a);
			const T *b = static_cast<const T *>(g.b);
			T *c = static_cast<T *>(g.c);
			for (int64_t p = 0; p < g.batch; p++) {
				for (int64_t i = 0; i < g.m; i++) {
					for (int64_t j = 0; j < g.n; j++) {
						CascadeSum<T> acc; // cuBLAS sums k in blocks too
						for (int64_t k = 0; k < g.k; k++) {
							acc.add(a[(p * g.m + i) * g.k + k] * b[(p * g.k + k) * g.n + j]);
						}
						c[(p * g.m + i) * g.n + j] = acc.result();
					}
				}
			}
		});
	}
	void map(DType dt, Fn fn, double param, const void *x, void *z, uint64_t n) override {
		c_.launches++;
		with_real_type(dt, [&](auto tag) {
			using T = decltype(tag);
			MapParam<T> p;
			p.real = static_cast<T>(param);
			const T *xp = static_cast<const T *>(x);
			T *zp = static_cast<T *>(z);
			with_gpu_map(fn, [&](auto m) {
				using M = decltype(m);
				for (uint64_t i = 0; i < n; i++) {
					zp[i] = M::template f<T>(xp[i], p);
				}
			});
		});
	}

private:
	Counters &c_;
};

class EmulatedDevice final : public Device {
public:
	EmulatedDevice() {
		c_.capacity = capacity_from_env();
	}
	std::unique_ptr<Stream> stream(int ordinal, const char *fn) override {
		if (ordinal != 0) {
			fail(std::string(fn) + ": no CUDA device " + std::to_string(ordinal) + " (the emulated device is 0)");
		}
		return std::make_unique<EmulatedStream>(c_);
	}
	std::string describe() override {
		return "emulated: 1 device(s): 0 emulated; uploaded " + std::to_string(c_.uploaded.load()) +
		       " downloaded " + std::to_string(c_.downloaded.load()) + " launches " +
		       std::to_string(c_.launches.load()) + " live " + std::to_string(c_.live_bytes.load());
	}

private:
	Counters c_;
};

} // namespace

std::unique_ptr<Device> make_device() {
	return std::make_unique<EmulatedDevice>();
}

} // namespace gpu
} // namespace tsk
