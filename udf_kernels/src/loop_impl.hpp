// The templates of the generic strided loop (loop.hpp), included by the translation units that instantiate
// them (loop_float.cpp, loop_int.cpp).
#pragma once

#include "gemm.hpp"
#include "loop.hpp"
#include "pairwise.hpp"
#include "permute.hpp"

namespace tsk {
namespace loop_detail {

// The A-reduction over the inner loops of J(x, y) (of x alone when !BIN) at output offsets (ox, oy); not empty.
// A float or complex sum is summed pairwise (pairwise.hpp), like numpy's.
template <class T, class J, class A, bool BIN>
inline T reduce_inner(const Plan &p, const T *x, const T *y, int64_t ox, int64_t oy) {
	const auto value = [&](int64_t a, int64_t b) {
		if constexpr (BIN) {
			return J::f(x[a], y[b]);
		} else {
			(void)b;
			return x[a];
		}
	};
	if constexpr (std::is_same_v<A, ASum> && kPairwise<T>) {
		return pairwise_over<T>(p.inner.data(), p.inner.size(), ox, oy, value);
	} else {
		T acc = A::template identity<T>();
		odometer(p.inner.data(), p.inner.size(), ox, oy, [&](int64_t a, int64_t b) {
			if constexpr (BIN) {
				acc = A::f(acc, J::f(x[a], y[b]));
			} else {
				(void)b;
				acc = A::f(acc, x[a]);
			}
		});
		return acc;
	}
}

// z[i] = r, or with `accumulate` A(z[i], r), for r the A-reduction over the inner loops of J(x, y) at output
// element i. Not inlined into kernel(): inlined there, the max/min loops measured ~15% slower.
template <class T, class J, class A, bool BIN>
[[gnu::noinline]] void reduce_all(const Plan &p, const T *x, const T *y, T *z, bool accumulate) {
	odometer(p.outer.data(), p.outer.size(), 0, 0, [&](int64_t ox, int64_t oy) {
		const T r = reduce_inner<T, J, A, BIN>(p, x, y, ox, oy);
		*z = accumulate ? A::f(*z, r) : r;
		z++;
	});
}

// z[i] = J(x[i * sx], y[i * sy]) for i in [0, n) (x[i * sx] alone when !BIN): unit and zero strides spelled out,
// so the compiler vectorizes them (the general strided loop measured ~7 ns per element of a 'ab,->ab' join).
template <class T, class J, bool BIN>
inline void join_row(const T *x, const T *y, T *z, int64_t n, int64_t sx, int64_t sy) {
	if (n <= 0) { // an empty row: x and y may hold no element at all
		return;
	}
	if constexpr (BIN) {
		if (sx == 1 && sy == 1) {
			for (int64_t i = 0; i < n; i++) {
				z[i] = J::f(x[i], y[i]);
			}
		} else if (sx == 1 && sy == 0) {
			const T b = y[0];
			for (int64_t i = 0; i < n; i++) {
				z[i] = J::f(x[i], b);
			}
		} else if (sx == 0 && sy == 1) {
			const T a = x[0];
			for (int64_t i = 0; i < n; i++) {
				z[i] = J::f(a, y[i]);
			}
		} else {
			for (int64_t i = 0; i < n; i++) {
				z[i] = J::f(x[i * sx], y[i * sy]);
			}
		}
	} else {
		(void)y;
		(void)sy;
		for (int64_t i = 0; i < n; i++) {
			z[i] = x[i * sx];
		}
	}
}

// A sum over leading labels of rows that are contiguous in x (a bias gradient 'ab->b', 'abc->bc'): whole rows
// are added, a tile of the row at a time, so x is read in order; per output element the additions keep
// PairwiseSum's shape (PairwiseRows), so the error grows as O(log n) as before. Summed per output element
// along a strided label, a 1024 x 1024 float32 'ab->b' took 2.5 ms (a cache miss per element), now 0.35.
constexpr int64_t kRowMaxTerms = int64_t(1) << 22;

// Whether plan p (unary) sums rows: its last output label is unit-stride in x, at least 8 long, and no summed
// label is (so rows never overlap); the number of rows per output is bounded (their offsets are listed).
inline bool sums_rows(const Plan &p) {
	if (p.outer.empty() || p.inner.empty() || p.outer.back().sx != 1 || p.outer.back().size < 8) {
		return false;
	}
	int64_t m = 1;
	for (const Loop &l : p.inner) {
		if (l.sx == 1 || l.sx == 0) {
			return false;
		}
		m *= l.size;
		if (m > kRowMaxTerms) {
			return false;
		}
	}
	return true;
}

template <class T>
void sum_rows(const Plan &p, const T *x, T *z, bool accumulate) {
	using Rows = PairwiseRows<T>;
	const int64_t L = p.outer.back().size;
	std::vector<int64_t> offs;
	odometer(p.inner.data(), p.inner.size(), 0, 0, [&](int64_t ox, int64_t) { offs.push_back(ox); });
	const int64_t m = static_cast<int64_t>(offs.size());
	Rows rows(m, L);
	const int64_t tile = rows.width();
	T *leaf = rows.leaf();
	T *zp = z;
	odometer(p.outer.data(), p.outer.size() - 1, 0, 0, [&](int64_t ox, int64_t) {
		for (int64_t j0 = 0; j0 < L; j0 += tile) {
			const int64_t w = L - j0 < tile ? L - j0 : tile;
			rows.start(w);
			for (int64_t t0 = 0; t0 < m; t0 += Rows::kRun) {
				const int64_t t1 = m - t0 < Rows::kRun ? m : t0 + Rows::kRun;
				const T *r = x + ox + offs[static_cast<size_t>(t0)] + j0;
				for (int64_t j = 0; j < w; j++) {
					leaf[j] = r[j];
				}
				for (int64_t t = t0 + 1; t < t1; t++) {
					r = x + ox + offs[static_cast<size_t>(t)] + j0;
					for (int64_t j = 0; j < w; j++) {
						leaf[j] = wadd(leaf[j], r[j]);
					}
				}
				rows.carry();
			}
			rows.total(zp + j0, accumulate);
		}
		zp += L;
	});
}

// z = the A-reduction over the inner loops of J(x, y) (of x alone when !BIN), or with `accumulate`
// z[i] = A(z[i], that reduction): the fused form of tensor_<agg>(tensor_einsum(...)). A runtime flag rather than
// a template parameter: the kernels are instantiated for every dtype x join x agg, and the branch is per element
// of the output, never in the reduction.
template <class T, class J, class A, bool BIN>
void kernel(const Plan &p, const T *x, const T *y, T *z, bool accumulate) {
	T *zp = z;
	if constexpr (!BIN) {
		if (p.inner.empty() && !accumulate) { // a unary einsum without reduction is a permutation (diagonals too)
			permute_into(p.outer.data(), p.outer.size(), x, z);
			return;
		}
	}
	if (p.inner.empty() && !accumulate && !p.outer.empty()) { // the join alone, a row of the last label at a time
		const Loop &last = p.outer.back();
		odometer(p.outer.data(), p.outer.size() - 1, 0, 0, [&](int64_t ox, int64_t oy) {
			join_row<T, J, BIN>(x + ox, y + oy, zp, last.size, last.sx, last.sy);
			zp += last.size;
		});
		return;
	}
	if (p.inner.empty()) { // nothing aggregated: the output is just the join
		odometer(p.outer.data(), p.outer.size(), 0, 0, [&](int64_t ox, int64_t oy) {
			T v;
			if constexpr (BIN) {
				v = J::f(x[ox], y[oy]);
			} else {
				(void)oy;
				v = x[ox];
			}
			*zp = accumulate ? A::f(*zp, v) : v;
			zp++;
		});
		return;
	}
	if constexpr (!BIN && std::is_same_v<A, ASum>) {
		if (sums_rows(p)) {
			sum_rows<T>(p, x, z, accumulate);
			return;
		}
	}
	reduce_all<T, J, A, BIN>(p, x, y, z, accumulate);
}

template <class T, class J, bool BIN>
void run_agg(Agg agg, const Plan &p, const T *x, const T *y, T *z, bool accumulate, const char *fn) {
	with_agg(agg, [&](auto tag) {
		using A = decltype(tag);
		if constexpr (is_complex_v<T> && !A::kComplex) {
			not_for_complex(fn, "agg", A::kName, name_of<T>());
		} else {
			kernel<T, J, A, BIN>(p, x, y, z, accumulate);
		}
	});
}

template <class T>
void run_join(Join join, Agg agg, const Plan &p, const T *x, const T *y, T *z, bool accumulate, const char *fn) {
	with_join(join, [&](auto tag) {
		using J = decltype(tag);
		if constexpr (is_complex_v<T> && !J::kComplex) {
			not_for_complex(fn, "join", J::kName, name_of<T>());
		} else {
			run_agg<T, J, true>(agg, p, x, y, z, accumulate, fn);
		}
	});
}

// run_join with cancellation and progress (control.hpp) and the database's threads: over 2 * kLoopStep flops
// (as the planner counts them: 2 per element pair), the output's outer loops run one prefix combination at a
// time, each about kLoopStep, checking for cancellation in between; over kLoopElementsPerThread element pairs
// per thread (gemm.hpp), the prefix combinations are split over the budget's threads, each writing its own
// contiguous range of the output. Every output element is computed as in one call (its reduction in the same
// order), so the result is the same bit for bit.
constexpr double kLoopStep = 2.0e8;

template <class F>
void loop_steps(ThreadBudget *budget, const Plan &p, const char *fn, F &&run_sub) {
	Control *ctl = control_of(budget);
	double work = 2.0;
	for (const auto *loops : {&p.outer, &p.inner}) {
		for (const Loop &l : *loops) {
			work *= static_cast<double>(l.size);
		}
	}
	const int want = budget != nullptr && !p.outer.empty() ? loop_threads_wanted(work / 2.0, budget->total()) : 1;
	if (ctl != nullptr) {
		ctl->announce(work);
	}
	if (p.outer.empty() || (want <= 1 && (ctl == nullptr || work <= 2.0 * kLoopStep))) {
		run_sub(p, int64_t(0), int64_t(0), int64_t(0));
		if (ctl != nullptr) {
			ctl->add(work);
		}
		return;
	}
	// steps: the combinations of the leading outer loops, each about kLoopStep and at least 4 per thread; the
	// last outer loop stays whole (a row the loops write, or sum, in one pass) unless it is cut in pieces
	const int64_t enough = 4 * static_cast<int64_t>(want);
	size_t d = 0;
	double per = work;
	int64_t steps = 1;
	while (d + 1 < p.outer.size() && (per > kLoopStep || steps < enough)) {
		per /= static_cast<double>(p.outer[d].size);
		steps *= p.outer[d].size;
		d++;
	}
	const Loop last = p.outer.back();
	int64_t pieces = 1;
	if (d + 1 == p.outer.size() && (per > kLoopStep || steps < enough)) {
		const double by_work = std::ceil(per / kLoopStep);
		const double by_threads = std::ceil(static_cast<double>(enough) / static_cast<double>(steps));
		const double most = static_cast<double>(last.size >= 64 ? last.size / 64 : 1); // >= 64 elements a piece
		pieces = static_cast<int64_t>(std::min(most, std::max(by_work, by_threads)));
		per /= static_cast<double>(pieces);
	}
	Plan sub;
	sub.outer.assign(p.outer.begin() + static_cast<std::ptrdiff_t>(d), p.outer.end());
	sub.inner = p.inner;
	int64_t zn = 1;
	for (const Loop &l : sub.outer) {
		zn *= l.size;
	}
	// no more tokens than pieces of work: a token held idle would keep another call waiting
	const int64_t chunks = steps * pieces;
	const int use = chunks < want ? static_cast<int>(chunks) : want;
	const int got = use > 1 ? budget->acquire(use) : 1;
	Lease lease {use > 1 ? budget : nullptr, got};
	parallel_chunks(got > 1 ? budget : nullptr, got, chunks, [&](int64_t s0, int64_t s1) {
		Plan piece = sub;
		for (int64_t s = s0; s < s1; s++) {
			const int64_t q = s / pieces, c = s % pieces;
			int64_t rest = q, ox = 0, oy = 0;
			for (size_t k = d; k-- > 0;) {
				const Loop &l = p.outer[k];
				const int64_t i = rest % l.size;
				rest /= l.size;
				ox += i * l.sx;
				oy += i * l.sy;
			}
			if (ctl != nullptr) {
				ctl->check(fn);
			}
			if (pieces == 1) {
				run_sub(sub, ox, oy, q * zn);
			} else { // the last loop's elements [j0, j1): zn = last.size here
				const int64_t j0 = last.size * c / pieces, j1 = last.size * (c + 1) / pieces;
				piece.outer.back().size = j1 - j0;
				run_sub(piece, ox + j0 * last.sx, oy + j0 * last.sy, q * zn + j0);
			}
			if (ctl != nullptr) {
				ctl->add(per);
			}
		}
	});
}

template <class T>
void run_join_steps_impl(ThreadBudget *budget, Join join, Agg agg, const Plan &p, const T *x, const T *y, T *z,
                         bool accumulate, const char *fn) {
	loop_steps(budget, p, fn, [&](const Plan &sub, int64_t ox, int64_t oy, int64_t oz) {
		run_join<T>(join, agg, sub, x + ox, y + oy, z + oz, accumulate, fn);
	});
}

} // namespace loop_detail

template <class T>
void run_join_steps(ThreadBudget *budget, Join join, Agg agg, const Plan &p, const T *x, const T *y, T *z,
                    bool accumulate, const char *fn) {
	loop_detail::run_join_steps_impl<T>(budget, join, agg, p, x, y, z, accumulate, fn);
}

template <class T>
void run_unary(ThreadBudget *budget, Agg agg, const Plan &p, const T *x, T *z, const char *fn) {
	loop_detail::loop_steps(budget, p, fn, [&](const Plan &sub, int64_t ox, int64_t, int64_t oz) {
		loop_detail::run_agg<T, JMul, false>(agg, sub, x + ox, x + ox, z + oz, false, fn);
	});
}

} // namespace tsk

// Instantiates the loop for element type T.
#define TSK_LOOP_INSTANCE(T)                                                                                         \
	template void run_join_steps<T>(ThreadBudget *, Join, Agg, const Plan &, const T *, const T *, T *, bool,        \
	                                const char *);                                                                   \
	template void run_unary<T>(ThreadBudget *, Agg, const Plan &, const T *, T *, const char *);
