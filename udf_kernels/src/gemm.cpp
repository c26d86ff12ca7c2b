#include "gemm.hpp"
#include "pairwise.hpp"
#include "pgemm.hpp"
#include "permute.hpp"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <exception>

namespace tsk {

void blas_single_threaded() {
	scipy_openblas_set_num_threads(1);
}

namespace {

// Work below this many flops per thread is not worth another thread (pool hand-off ~10 us).
constexpr double kFlopsPerThread = 12.0e6;

bool unit(int64_t stride, int64_t extent) {
	return extent <= 1 || stride == 1;
}

// Fuses a group of labels (in the given order) into one strided dimension of an operand: adjacent in the
// layout, same order. Size-1 labels are ignored. stride = the group's innermost stride (0 when trivial).
bool fuse(const std::vector<int> &group, const int64_t *size, const int64_t *stride, int64_t &out) {
	out = 0;
	int64_t expect = -1;
	for (size_t i = group.size(); i-- > 0;) {
		const int l = group[i];
		if (size[l] == 1) {
			continue;
		}
		if (expect < 0) {
			out = stride[l];
		} else if (stride[l] != expect) {
			return false;
		}
		expect = stride[l] * size[l];
	}
	return true;
}

int64_t prod(const std::vector<int> &group, const int64_t *size) {
	int64_t p = 1;
	for (int l : group) {
		p *= size[l];
	}
	return p;
}

// BLAS view of a rows x cols matrix with strides (sr, sc): sets trans/ld; false when it has no unit stride.
bool blas_view(int64_t rows, int64_t cols, int64_t sr, int64_t sc, bool &trans, int64_t &ld) {
	if (unit(sc, cols)) {
		trans = false;
		ld = rows <= 1 ? std::max<int64_t>(1, cols) : sr;
		return ld >= std::max<int64_t>(1, cols) && ld <= INT_MAX;
	}
	if (unit(sr, rows)) {
		trans = true;
		ld = cols <= 1 ? std::max<int64_t>(1, rows) : sc;
		return ld >= std::max<int64_t>(1, rows) && ld <= INT_MAX;
	}
	return false;
}

struct LabelInfo {
	int64_t size[kNumLabels];
	int64_t stride[2][kNumLabels];
	int count[2][kNumLabels];
};

OperandPlan plan_operand(int op, const LabelInfo &li, const std::vector<int> &bg, const std::vector<int> &rows,
                         const std::vector<int> &cols, const std::vector<int> &priv, int64_t nb, int64_t nrows,
                         int64_t ncols, bool integer, bool is_b) {
	OperandPlan p;
	bool ok = priv.empty();
	for (const auto *g : {&bg, &rows, &cols}) {
		for (int l : *g) {
			// a batch label the operand lacks is read with stride 0 (promote_batch); any other label once
			ok = ok && (li.count[op][l] == 1 || (g == &bg && li.count[op][l] == 0));
		}
	}
	ok = ok && fuse(bg, li.size, li.stride[op], p.sb) && fuse(rows, li.size, li.stride[op], p.sr) &&
	     fuse(cols, li.size, li.stride[op], p.sc);
	if (ok) {
		if (integer) {
			ok = !is_b || unit(p.sc, ncols);
		} else {
			ok = blas_view(nrows, ncols, p.sr, p.sc, p.trans, p.ld);
		}
	}
	if (ok) {
		return p;
	}
	p = OperandPlan {};
	p.pack = true;
	for (const auto *g : {&bg, &rows, &cols}) {
		for (int l : *g) {
			p.pack_outer.push_back(Loop {li.size[l], li.stride[op][l], 0});
		}
	}
	for (int l : priv) {
		p.pack_inner.push_back(Loop {li.size[l], li.stride[op][l], 0});
	}
	p.pack_numel = static_cast<uint64_t>(nb * nrows * ncols);
	p.sb = nrows * ncols;
	p.sr = ncols;
	p.sc = 1;
	p.trans = false;
	p.ld = std::max<int64_t>(1, ncols);
	return p;
}

// Tiles of one group (B, M or N): the largest sub-box with at most `cap` elements of the form
// (one value of each label before `level`) x (a range of `level`) x (all of the labels after it).
Contraction::GroupTiles group_tiles(const std::vector<int> &g, const int64_t *size, int64_t cap) {
	Contraction::GroupTiles t;
	for (int l : g) {
		t.sizes.push_back(size[l]);
	}
	cap = std::max<int64_t>(1, cap);
	const size_t p = t.sizes.size();
	if (p == 0) {
		return t; // one tile of one element
	}
	for (size_t level = 0; level < p; level++) {
		int64_t inner = 1;
		for (size_t i = level + 1; i < p; i++) {
			inner *= t.sizes[i];
		}
		if (inner <= cap || level + 1 == p) {
			t.level = level;
			t.range = std::max<int64_t>(1, std::min<int64_t>(t.sizes[level], cap / inner));
			t.rows = t.range * inner;
			break;
		}
	}
	t.count = 1;
	for (size_t i = 0; i < t.level; i++) {
		t.count *= t.sizes[i];
	}
	t.count *= (t.sizes[t.level] + t.range - 1) / t.range;
	return t;
}

// C tile target: ~256 KiB (L2-resident next to the operand panels) and at least 128 rows where M allows.
constexpr int64_t kTileBytes = 256 * 1024;

void plan_tiles(Contraction &c, const std::vector<int> &B, const std::vector<int> &M, const std::vector<int> &N,
                const int64_t *size, const int64_t *zstride, const std::string &output, size_t isz, int64_t k) {
	const int64_t m = prod(M, size), n = prod(N, size);
	const int64_t cap = std::max<int64_t>(4096, kTileBytes / static_cast<int64_t>(isz));
	if (m * n <= 2 * cap) {
		return; // one scratch C per batch is small already
	}
	Contraction::GroupTiles nt = group_tiles(N, size, std::max<int64_t>(1, cap / std::min<int64_t>(m, 128)));
	Contraction::GroupTiles mt = group_tiles(M, size, std::max<int64_t>(1, cap / nt.rows));
	// BLAS packs its operands on every call, so each M tile reads all of B again and each N tile all of A.
	// Tiles pay off when K is short (the pass over C dominates); with a long K that re-reading costs more than
	// forming C whole in scratch and permuting it into Z (one more write and read of C).
	const double reread = static_cast<double>(mt.count - 1) * static_cast<double>(k) * static_cast<double>(n) +
	                      static_cast<double>(nt.count - 1) * static_cast<double>(m) * static_cast<double>(k);
	if (reread > 2.0 * static_cast<double>(m) * static_cast<double>(n)) {
		return;
	}
	c.tiled = true;
	c.bt = group_tiles(B, size, 1); // batches one at a time
	c.nt = nt;
	c.mt = mt;
	int pos[3] = {0, 0, 0};
	for (char ch : output) {
		const int l = label_index(ch);
		int g = 0;
		if (std::find(M.begin(), M.end(), l) != M.end()) {
			g = 1;
		} else if (std::find(N.begin(), N.end(), l) != N.end()) {
			g = 2;
		}
		c.zlabels.push_back(Contraction::ZLabel {size[l], zstride[l], g, pos[g]++});
	}
}

// Operands at least this many elements are worth keeping in place rather than packing (see promote_batch).
constexpr int64_t kPromoteElements = int64_t(1) << 15;

// An operand whose row (or column) labels do not fuse into one strided dimension is packed: a copy as large as
// the operand. When its leading labels are all output labels of its own (no batch labels otherwise), they can be
// batch labels instead, the other operand read with stride 0 along them: the GEMM then runs once per batch on
// the operand in place ('abcdefg,e->abcdfg' over a 94 MB x: 20 ms packed, a few ms per batch). `own` is the
// operand's group (M for x, N for y); on success the prefix moves from `own` to B. Only where the remaining
// labels fuse in the operand and both groups fuse in Z, and where the per-batch products are matrix-vector
// products (a loop) or few enough that a BLAS call per batch costs less than the copy.
void promote_batch(int op, const Spec &spec, const LabelInfo &li, const int64_t *zstride, std::vector<int> &B,
                   std::vector<int> &own, const std::vector<int> &other, const std::vector<int> &K,
                   const std::vector<int> &priv, const std::vector<int> &other_priv) {
	if (!B.empty() || !priv.empty() || !other_priv.empty() || own.size() < 2) {
		return;
	}
	// the other operand must be read in place too: packed, it would be copied once per batch
	const int o = 1 - op;
	int64_t so = 0, sko = 0;
	for (const auto *g : {&other, &K}) {
		for (int l : *g) {
			if (li.count[o][l] != 1) {
				return;
			}
		}
	}
	if (!fuse(other, li.size, li.stride[o], so) || !fuse(K, li.size, li.stride[o], sko) ||
	    !(unit(so, prod(other, li.size)) || unit(sko, prod(K, li.size)))) {
		return;
	}
	const std::string &labels = spec.inputs[static_cast<size_t>(op)];
	int64_t numel = 1;
	for (char ch : labels) {
		const int l = label_index(ch);
		if (li.count[op][l] != 1) {
			return; // a repeated label (a diagonal): packed as before
		}
		numel *= li.size[l];
	}
	if (numel < kPromoteElements) {
		return;
	}
	int64_t st = 0;
	if (fuse(own, li.size, li.stride[op], st)) {
		return; // no pack needed
	}
	// the longest prefix of the operand's layout made of its own group's labels
	std::vector<int> prefix;
	for (char ch : labels) {
		const int l = label_index(ch);
		if (std::find(own.begin(), own.end(), l) == own.end()) {
			break;
		}
		prefix.push_back(l);
	}
	if (prefix.empty() || prefix.size() == own.size()) {
		return;
	}
	std::vector<int> batch, rest; // in output order, as the groups are
	for (int l : own) {
		(std::find(prefix.begin(), prefix.end(), l) != prefix.end() ? batch : rest).push_back(l);
	}
	int64_t sb = 0, sr = 0, sk = 0, zb = 0, zr = 0, zo = 0;
	if (!fuse(batch, li.size, li.stride[op], sb) || !fuse(rest, li.size, li.stride[op], sr) ||
	    !fuse(K, li.size, li.stride[op], sk) || !fuse(batch, li.size, zstride, zb) ||
	    !fuse(rest, li.size, zstride, zr) || !fuse(other, li.size, zstride, zo)) {
		return;
	}
	const int64_t nb = prod(batch, li.size), rows = prod(rest, li.size), cols = prod(other, li.size);
	const bool matvec = rows == 1 || cols == 1;
	if (!matvec && nb * 2000 > numel) { // a BLAS call per batch (~1 us) against packing (~0.5 ns an element)
		return;
	}
	B = batch;
	own = rest;
}

} // namespace

int64_t Contraction::GroupTiles::tile(int64_t t, int64_t *start, int64_t *len) const {
	const size_t p = sizes.size();
	if (p == 0) {
		return 0;
	}
	const int64_t nr = (sizes[level] + range - 1) / range;
	const int64_t r = t % nr;
	t /= nr;
	start[level] = r * range;
	len[level] = std::min<int64_t>(range, sizes[level] - r * range);
	for (size_t i = level; i-- > 0;) {
		start[i] = t % sizes[i];
		len[i] = 1;
		t /= sizes[i];
	}
	for (size_t i = level + 1; i < p; i++) {
		start[i] = 0;
		len[i] = sizes[i];
	}
	int64_t lin = 0;
	for (size_t i = 0; i < p; i++) {
		lin = lin * sizes[i] + start[i];
	}
	return lin;
}

Contraction plan_contraction(const Spec &spec, const Shape &xs, const Shape &ys, size_t isz, bool integer,
                             const char *fn) {
	static const char *const names[] = {"x", "y"};
	const Shape *shapes[] = {&xs, &ys};
	const Plan base = make_plan(spec, shapes, names, isz, fn); // validates ranks, label sizes, output size
	Contraction c;
	c.fn = fn;
	c.out_shape = base.out_shape;
	c.out_numel = base.out_numel;

	LabelInfo li {};
	std::vector<int> order;
	bool seen[kNumLabels] = {};
	for (int i = 0; i < 2; i++) {
		const std::string &labels = spec.inputs[i];
		const Shape &shape = *shapes[i];
		int64_t st = 1;
		for (size_t d = labels.size(); d-- > 0;) {
			const int l = label_index(labels[d]);
			li.size[l] = shape[d];
			li.stride[i][l] += st;
			li.count[i][l] += 1;
			st *= shape[d];
		}
		for (char ch : labels) {
			const int l = label_index(ch);
			if (!seen[l]) {
				seen[l] = true;
				order.push_back(l);
			}
		}
	}
	bool in_z[kNumLabels] = {};
	int64_t zstride[kNumLabels] = {};
	{
		int64_t st = 1;
		for (size_t d = spec.output.size(); d-- > 0;) {
			const int l = label_index(spec.output[d]);
			in_z[l] = true;
			zstride[l] = st;
			st *= li.size[l];
		}
	}
	std::vector<int> B, M, N, K, PX, PY;
	for (char ch : spec.output) {
		const int l = label_index(ch);
		const bool x = li.count[0][l] > 0, y = li.count[1][l] > 0;
		(x && y ? B : x ? M : N).push_back(l);
	}
	for (int l : order) {
		if (in_z[l]) {
			continue;
		}
		const bool x = li.count[0][l] > 0, y = li.count[1][l] > 0;
		(x && y ? K : x ? PX : PY).push_back(l);
	}
	for (int l : order) {
		if (li.size[l] == 0) {
			c.empty = true;
		}
	}
	auto kind_str = [](const char *name, const std::vector<int> &g) {
		std::string s = name;
		s += ":";
		for (int l : g) {
			s += static_cast<char>(l < 26 ? 'a' + l : 'A' + (l - 26));
		}
		return s + " ";
	};
	c.kinds = kind_str("B", B) + kind_str("M", M) + kind_str("N", N) + kind_str("K", K) + kind_str("PX", PX) +
	          kind_str("PY", PY);
	if (c.empty) {
		return c;
	}
	if (!integer) { // the integer loop reads B with unit column strides only; it packs as before
		promote_batch(0, spec, li, zstride, B, M, N, K, PX, PY);
		promote_batch(1, spec, li, zstride, B, N, M, K, PY, PX);
	}
	const int64_t nb = prod(B, li.size), m = prod(M, li.size), n = prod(N, li.size), k = prod(K, li.size);
	c.flops = 2.0 * static_cast<double>(nb) * static_cast<double>(m) * static_cast<double>(n) *
	          static_cast<double>(k);

	// Orientation from Z's layout.
	int64_t zb = 0, zm = 0, zn = 0;
	const bool zfuse = fuse(B, li.size, zstride, zb) && fuse(M, li.size, zstride, zm) && fuse(N, li.size, zstride, zn);
	bool trans_dummy = false;
	int64_t ldc = 0;
	if (zfuse && unit(zn, n) && blas_view(m, n, zm, 1, trans_dummy, ldc) && !trans_dummy) {
		c.swap = false;
		c.cb = zb;
		c.cr = ldc;
	} else if (zfuse && unit(zm, m) && blas_view(n, m, zn, 1, trans_dummy, ldc) && !trans_dummy) {
		c.swap = true;
		c.cb = zb;
		c.cr = ldc;
	} else {
		c.swap = false;
		c.pack_c = true;
		c.cb = m * n;
		c.cr = std::max<int64_t>(1, n);
		// scratch layout [B, M, N]: stride of each label there
		int64_t sstride[kNumLabels] = {};
		int64_t st = 1;
		std::vector<int> canon;
		canon.insert(canon.end(), B.begin(), B.end());
		canon.insert(canon.end(), M.begin(), M.end());
		canon.insert(canon.end(), N.begin(), N.end());
		for (size_t i = canon.size(); i-- > 0;) {
			sstride[canon[i]] = st;
			st *= li.size[canon[i]];
		}
		for (char ch : spec.output) {
			const int l = label_index(ch);
			c.unpack.push_back(Loop {li.size[l], sstride[l], 0});
		}
		plan_tiles(c, B, M, N, li.size, zstride, spec.output, isz, k);
	}
	c.nb = nb;
	c.m = c.swap ? n : m;
	c.n = c.swap ? m : n;
	c.k = k;
	if (c.swap) {
		c.a = plan_operand(1, li, B, N, K, PY, nb, n, k, integer, false);
		c.b = plan_operand(0, li, B, K, M, PX, nb, k, m, integer, true);
	} else {
		c.a = plan_operand(0, li, B, M, K, PX, nb, m, k, integer, false);
		c.b = plan_operand(1, li, B, K, N, PY, nb, k, n, integer, true);
	}
	if (c.m > INT_MAX || c.n > INT_MAX || c.k > INT_MAX) {
		fail(std::string(fn) + ": a GEMM dimension exceeds the BLAS integer range");
	}
	return c;
}

namespace {

// permute_into on `threads` threads already held from `budget`: ranges of the outermost loop that is not of
// size 1 (dst is contiguous in the loops' C order, so each range writes its own contiguous part, and the
// walk inside a range, its 2-D transpose tiles included, is permute_into's). Packing a GEMM's operands and
// unpacking its product are memory-bound walks as large as the operands: left serial they held a 16-thread
// contraction to a fraction of its GEMM's speed (benchmark (d) on 16 cores: TCCG 3 went from 2.2x opt_einsum's
// time to 0.7x).
template <class T, class Op = Assign>
void permute_on(ThreadBudget *budget, int threads, const Loop *L, size_t n, const T *src, T *dst, Op op = Op {}) {
	size_t first = 0;
	while (first < n && L[first].size == 1) {
		first++;
	}
	if (budget == nullptr || threads <= 1 || first + 1 >= n) { // one loop left: one contiguous run or a gather
		permute_into(L, n, src, dst, op);
		return;
	}
	int64_t inner = 1;
	for (size_t k = first + 1; k < n; k++) {
		inner *= L[k].size;
	}
	parallel_chunks(budget, threads, L[first].size, [&](int64_t c0, int64_t c1) {
		std::vector<Loop> loops(L + first, L + n);
		loops[0].size = c1 - c0;
		permute_into(loops.data(), loops.size(), src + c0 * L[first].sx, dst + c0 * inner, op);
	});
}

// The threads a permute of `numel` elements is worth, at most `cap` (the outermost loop's pieces).
inline int permute_threads_wanted(ThreadBudget *budget, int64_t numel, int64_t cap) {
	if (budget == nullptr) {
		return 1;
	}
	const int64_t want = loop_threads_wanted(static_cast<double>(numel), budget->total());
	return static_cast<int>(std::max<int64_t>(1, std::min(want, cap)));
}

inline int64_t outer_size(const std::vector<Loop> &L) {
	for (size_t k = 0; k < L.size(); k++) {
		if (L[k].size != 1) {
			return k + 1 < L.size() ? L[k].size : 1; // permute_on splits only a loop with loops inside it
		}
	}
	return 1;
}

template <class T>
const T *pack(const OperandPlan &p, const T *src, AlignedBuf &buf, ThreadBudget *budget) {
	T *dst = reinterpret_cast<T *>(buf.resize(p.pack_numel * sizeof(T)));
	T *d = dst;
	if (p.pack_inner.empty()) {
		const int want = permute_threads_wanted(budget, p.pack_numel, outer_size(p.pack_outer));
		const int got = want > 1 ? budget->acquire(want) : 1;
		Lease lease {want > 1 ? budget : nullptr, got};
		permute_on(budget, got, p.pack_outer.data(), p.pack_outer.size(), src, dst);
	} else {
		odometer(p.pack_outer.data(), p.pack_outer.size(), 0, 0, [&](int64_t o, int64_t) {
			if constexpr (kPairwise<T>) { // a private label summed away: pairwise, like any other sum
				*d++ = pairwise_over<T>(p.pack_inner.data(), p.pack_inner.size(), o, 0,
				                        [&](int64_t a, int64_t) { return src[a]; });
			} else {
				T acc = T(0);
				odometer(p.pack_inner.data(), p.pack_inner.size(), o, 0,
				         [&](int64_t a, int64_t) { acc = wadd(acc, src[a]); });
				*d++ = acc;
			}
		});
	}
	return dst;
}

// float32 products with a short K and operands of modest size go to the packed kernel (pgemm.hpp), on the
// avx512 kernel path only.
bool packed_small_k(int64_t m, int64_t n, int64_t k, KernelPath path) {
	if (k > 256 || m < 16 || n < 16 || (m + n) * k > (int64_t(8) << 20)) {
		return false;
	}
	return path == KernelPath::Avx512;
}

template <class T>
inline T mul_add(T acc, T a, T b) {
	if constexpr (is_complex_v<T>) {
		return T(acc.real() + (a.real() * b.real() - a.imag() * b.imag()),
		         acc.imag() + (a.real() * b.imag() + a.imag() * b.real()));
	} else {
		return acc + a * b;
	}
}

// The generic kernel path's float and complex GEMM (TENSORSQL_KERNEL_PATH=generic): portable C++, no BLAS and
// no packed kernel, a reference for the other paths. C (m x n, row stride ldc, unit column stride) (+)= A * B
// with A element (i, p) at a[i*sar + p*sac] and B element (p, j) at b[p*sbr + j*sbc].
template <class T>
void gemm_generic(const T *a, int64_t sar, int64_t sac, const T *b, int64_t sbr, int64_t sbc, T *cc, int64_t m,
                  int64_t n, int64_t k, int64_t ldc, bool beta1) {
	if (!beta1) {
		for (int64_t i = 0; i < m; i++) {
			std::fill(cc + i * ldc, cc + i * ldc + n, T(0));
		}
	}
	if (sbc != 1 && sbr == 1 && n > 1) {
		// B stored column-major: one dot product per element, reading B's columns in order
		for (int64_t i = 0; i < m; i++) {
			const T *arow = a + i * sar;
			for (int64_t j = 0; j < n; j++) {
				const T *bcol = b + j * sbc;
				T acc = T(0);
				for (int64_t p = 0; p < k; p++) {
					acc = mul_add(acc, arow[p * sac], bcol[p]);
				}
				cc[i * ldc + j] += acc;
			}
		}
		return;
	}
	// i-k-j over cache-sized blocks of K and of C's columns
	constexpr int64_t KB = 128, NB = 512;
	for (int64_t j0 = 0; j0 < n; j0 += NB) {
		const int64_t jn = std::min<int64_t>(NB, n - j0);
		for (int64_t k0 = 0; k0 < k; k0 += KB) {
			const int64_t kn = std::min<int64_t>(KB, k - k0);
			for (int64_t i = 0; i < m; i++) {
				T *crow = cc + i * ldc + j0;
				const T *arow = a + i * sar;
				for (int64_t p = k0; p < k0 + kn; p++) {
					const T av = arow[p * sac];
					const T *brow = b + p * sbr + j0 * sbc;
					if (sbc == 1) {
						for (int64_t j = 0; j < jn; j++) {
							crow[j] = mul_add(crow[j], av, brow[j]);
						}
					} else {
						for (int64_t j = 0; j < jn; j++) {
							crow[j] = mul_add(crow[j], av, brow[j * sbc]);
						}
					}
				}
			}
		}
	}
}

inline CBLAS_TRANSPOSE tr(bool t) {
	return t ? CblasTrans : CblasNoTrans;
}

// C (m x n, row stride ldc, unit col stride) (+)= A (m x k) * B (k x n): a = A's first row, Bm = B's first
// column, with the strides/transposition of c.a and c.b and k = c.k.
// `path`: the database's kernel path, which decides between BLAS, the packed kernel and the generic loop.
template <class T>
void gemm_raw(const Contraction &c, const T *a, const T *Bm, T *cc, int64_t m64, int64_t n64, int64_t ldc64,
              bool beta1, KernelPath path) {
	const int m = static_cast<int>(m64), n = static_cast<int>(n64), k = static_cast<int>(c.k);
	if (m <= 0 || n <= 0) {
		return;
	}
	if constexpr (std::is_floating_point_v<T> || is_complex_v<T>) {
		if (path == KernelPath::Generic) {
			gemm_generic<T>(a, c.a.sr, c.a.sc, Bm, c.b.sr, c.b.sc, cc, m64, n64, c.k, ldc64, beta1);
			return;
		}
	}
	const int lda = static_cast<int>(c.a.ld), ldb = static_cast<int>(c.b.ld), ldc = static_cast<int>(ldc64);
	if constexpr (std::is_same_v<T, float>) {
		if (packed_small_k(m64, n64, c.k, path)) {
			// OpenBLAS first scales C by beta (a memset for beta = 0): with a short K that extra pass over C
			// is 15-30% of the product. The packed kernel writes C once.
			AlignedBuf pa, pb;
			float *pa_ = reinterpret_cast<float *>(pa.resize(pgemm::packed_a_floats(m64, c.k) * sizeof(float)));
			float *pb_ = reinterpret_cast<float *>(pb.resize(pgemm::packed_b_floats(c.k, n64) * sizeof(float)));
			pgemm::pack_a(a, c.a.trans ? 1 : c.a.ld, c.a.trans ? c.a.ld : 1, m64, c.k, pa_);
			pgemm::pack_b(Bm, c.b.trans ? 1 : c.b.ld, c.b.trans ? c.b.ld : 1, c.k, n64, pb_);
			pgemm::gemm_packed(m64, n64, c.k, pa_, pb_, cc, ldc64, beta1);
			return;
		}
		scipy_cblas_sgemm(CblasRowMajor, tr(c.a.trans), tr(c.b.trans), m, n, k, 1.0f, a, lda, Bm, ldb,
		                  beta1 ? 1.0f : 0.0f, cc, ldc);
	} else if constexpr (std::is_same_v<T, double>) {
		scipy_cblas_dgemm(CblasRowMajor, tr(c.a.trans), tr(c.b.trans), m, n, k, 1.0, a, lda, Bm, ldb,
		                  beta1 ? 1.0 : 0.0, cc, ldc);
	} else if constexpr (is_complex_v<T>) {
		const T one(1), zero(0);
		const T *beta = beta1 ? &one : &zero;
		if constexpr (std::is_same_v<T, c64>) {
			scipy_cblas_cgemm(CblasRowMajor, tr(c.a.trans), tr(c.b.trans), m, n, k, &one, a, lda, Bm, ldb, beta, cc,
			                  ldc);
		} else {
			scipy_cblas_zgemm(CblasRowMajor, tr(c.a.trans), tr(c.b.trans), m, n, k, &one, a, lda, Bm, ldb, beta, cc,
			                  ldc);
		}
	} else {
		// integers: cache-blocked i-k-j loop, wrapping arithmetic, unit-stride inner loop over B's and C's rows
		using U = std::make_unsigned_t<T>;
		using W = uarith_t<T>; // the product of two 16-bit values overflows int: multiply in unsigned int
		constexpr int64_t KB = 128;
		constexpr int64_t NB = 8192 / sizeof(T) * 4 / 4; // ~8 KiB of a C row and of each B row per pass
		const int64_t sar = c.a.sr, sac = c.a.sc, sbr = c.b.sr, cr = ldc64;
		for (int64_t j0 = 0; j0 < n; j0 += NB) {
			const int64_t jn = std::min<int64_t>(NB, n - j0);
			if (!beta1) {
				for (int64_t i = 0; i < m; i++) {
					std::memset(cc + i * cr + j0, 0, static_cast<size_t>(jn) * sizeof(T));
				}
			}
			for (int64_t k0 = 0; k0 < k; k0 += KB) {
				const int64_t kn = std::min<int64_t>(KB, k - k0);
				for (int64_t i = 0; i < m; i++) {
					U *crow = reinterpret_cast<U *>(cc + i * cr + j0);
					const T *arow = a + i * sar;
					for (int64_t kk = k0; kk < k0 + kn; kk++) {
						const U av = static_cast<U>(arow[kk * sac]);
						if (av == 0) {
							continue;
						}
						const U *brow = reinterpret_cast<const U *>(Bm + kk * sbr + j0);
						for (int64_t j = 0; j < jn; j++) {
							crow[j] = static_cast<U>(static_cast<W>(crow[j]) + static_cast<W>(av) * static_cast<W>(brow[j]));
						}
					}
				}
			}
		}
	}
}

// A step of a long GEMM (control.hpp): a K panel of about kStepFlops, at least kStepK deep. BLAS packs each
// operand panel once either way, so a K step costs one more pass over C, not measurable at 256 (a 2048 x 4096
// x 4096 dgemm: the same time whole or in K panels of 256-1024, within noise).
constexpr double kStepFlops = 2.0e9;
constexpr int64_t kStepK = 256;

// C (m x n, row stride ldc) (+)= A (m x K) * B (K x n), as gemm_raw, counted into meter. With a Control and over
// 2 * kStepFlops it runs in K panels (and row panels when even one K panel is over 8 * kStepFlops: each row
// panel packs B again, so those stay big), and returns between steps when cancelled, C left partial.
template <class T>
void gemm_steps(const Contraction &c, const T *A, const T *Bm, T *C, int64_t m, int64_t n, int64_t ldc, bool beta1,
                Meter &meter, KernelPath path) {
	if (meter.stop()) {
		return;
	}
	const double per_k = 2.0 * static_cast<double>(m) * static_cast<double>(n);
	const double scale = is_complex_v<T> ? 4.0 : 1.0;
	int64_t kc = c.k, rc = m;
	if (meter.active() && per_k * scale * static_cast<double>(c.k) > 2.0 * kStepFlops) {
		// float32 products with K <= 256 go to the packed kernel in gemm_raw: keep its panels deeper than that
		const int64_t min_k = std::is_same_v<T, float> ? 2 * kStepK : kStepK;
		kc = std::max<int64_t>(min_k, static_cast<int64_t>(kStepFlops / (per_k * scale)) / kStepK * kStepK);
		const double panel = per_k * scale * static_cast<double>(std::min(kc, c.k));
		if (panel > 8.0 * kStepFlops) {
			rc = std::max<int64_t>(256, static_cast<int64_t>(8.0 * kStepFlops / panel * static_cast<double>(m)) / 16 * 16);
		}
	}
	std::unique_ptr<Contraction> part;
	if (kc < c.k || rc < m) {
		try {
			part = std::make_unique<Contraction>(c);
		} catch (...) { // no memory for the copy: one step, not cancellable (still the right result)
		}
	}
	if (!part) {
		gemm_raw<T>(c, A, Bm, C, m, n, ldc, beta1, path);
		meter.add(per_k * static_cast<double>(c.k));
		return;
	}
	const int64_t ksteps = std::max<int64_t>(1, c.k / kc); // panels of kc or more (a short tail joins them)
	for (int64_t r0 = 0; r0 < m; r0 += rc) {
		const int64_t rows = std::min(rc, m - r0);
		for (int64_t s = 0; s < ksteps; s++) {
			if (meter.stop()) {
				return;
			}
			const int64_t p0 = c.k * s / ksteps;
			part->k = c.k * (s + 1) / ksteps - p0;
			gemm_raw<T>(*part, A + r0 * c.a.sr + p0 * c.a.sc, Bm + p0 * c.b.sr, C + r0 * ldc, rows, n, ldc,
			            beta1 || s > 0, path);
			meter.add(2.0 * static_cast<double>(rows) * static_cast<double>(n) * static_cast<double>(part->k));
		}
	}
}

// C (+)= A * B for one batch, rows [r0, r1) of C (row stride c.cr).
template <class T>
void gemm_rows(const Contraction &c, const T *A, const T *Bm, T *C, int64_t r0, int64_t r1, bool beta1,
               Meter &meter, KernelPath path) {
	gemm_steps<T>(c, A + r0 * c.a.sr, Bm, C + r0 * c.cr, r1 - r0, c.n, c.cr, beta1, meter, path);
}

// Tiles [t0, t1) of a tiled pack_c contraction: each C tile is formed in `buf` and scattered into z.
template <class T>
void run_tiles(const Contraction &c, const T *A, const T *Bm, T *z, bool accumulate, int64_t t0, int64_t t1,
               AlignedBuf &buf, Meter &meter, KernelPath path) {
	const int64_t per_b = c.mt.count * c.nt.count;
	T *tile = reinterpret_cast<T *>(buf.resize(static_cast<size_t>(c.mt.rows * c.nt.rows) * sizeof(T)));
	std::vector<int64_t> bs(c.bt.sizes.size() + 1), bl(bs.size()), ms(c.mt.sizes.size() + 1), ml(ms.size()),
	    ns(c.nt.sizes.size() + 1), nl(ns.size());
	std::vector<int64_t> mstr(ms.size()), nstr(ns.size());
	std::vector<Loop> loops(c.zlabels.size());
	for (int64_t t = t0; t < t1; t++) {
		if (meter.stop()) {
			return;
		}
		const int64_t bi = c.bt.tile(t / per_b, bs.data(), bl.data());
		const int64_t m0 = c.mt.tile((t % per_b) / c.nt.count, ms.data(), ml.data());
		const int64_t n0 = c.nt.tile(t % c.nt.count, ns.data(), nl.data());
		int64_t mr = 1, nr = 1;
		for (size_t i = c.nt.sizes.size(); i-- > 0;) {
			nstr[i] = nr;
			nr *= nl[i];
		}
		for (size_t i = c.mt.sizes.size(); i-- > 0;) {
			mstr[i] = mr * nr;
			mr *= ml[i];
		}
		gemm_raw<T>(c, A + bi * c.a.sb + m0 * c.a.sr, Bm + bi * c.b.sb + n0 * c.b.sc, tile, mr, nr, nr, false, path);
		meter.add(2.0 * static_cast<double>(mr) * static_cast<double>(nr) * static_cast<double>(c.k));
		int64_t zoff = 0;
		for (size_t i = 0; i < c.zlabels.size(); i++) {
			const Contraction::ZLabel &zl = c.zlabels[i];
			const size_t j = static_cast<size_t>(zl.index);
			const int64_t st = zl.group == 0 ? bs[j] : zl.group == 1 ? ms[j] : ns[j];
			const int64_t len = zl.group == 0 ? bl[j] : zl.group == 1 ? ml[j] : nl[j];
			const int64_t sx = zl.group == 0 ? 0 : zl.group == 1 ? mstr[j] : nstr[j];
			zoff += st * zl.zstride;
			loops[i] = Loop {len, sx, zl.zstride};
		}
		if (accumulate) {
			strided_copy(loops.data(), loops.size(), tile, z + zoff, [](T &d, const T &v) { d = wadd(d, v); });
		} else {
			strided_copy(loops.data(), loops.size(), tile, z + zoff);
		}
	}
}

// Batches whose products are this small (m * n * k) run as plain loops: one GEMM call per batch costs ~100-200 ns
// of dispatch, so a Hadamard product (m = n = k = 1) as a batched GEMM measured ~40 ns per element.
constexpr int64_t kTinyGemm = 64;

// C[b] (+)= A[b] * B[b] for batches [b0, b1) of a contraction with m * n * k <= kTinyGemm: straight loops, the
// common one-element product (a Hadamard product or a broadcast scaling) with unit strides spelled out so it
// vectorizes.
template <class T>
void tiny_batches(const Contraction &c, const T *A, const T *Bm, T *C, int64_t b0, int64_t b1, bool beta1) {
	const int64_t asb = c.a.sb, bsb = c.b.sb, cb = c.cb;
	if (c.m == 1 && c.n == 1 && c.k == 1) {
		if (asb == 1 && bsb == 1 && cb == 1) {
			if (beta1) {
				for (int64_t i = b0; i < b1; i++) {
					C[i] = wadd(C[i], wmul(A[i], Bm[i]));
				}
			} else {
				for (int64_t i = b0; i < b1; i++) {
					C[i] = wmul(A[i], Bm[i]);
				}
			}
			return;
		}
		for (int64_t i = b0; i < b1; i++) {
			const T v = wmul(A[i * asb], Bm[i * bsb]);
			C[i * cb] = beta1 ? wadd(C[i * cb], v) : v;
		}
		return;
	}
	for (int64_t bi = b0; bi < b1; bi++) {
		const T *a = A + bi * asb;
		const T *b = Bm + bi * bsb;
		T *z = C + bi * cb;
		for (int64_t i = 0; i < c.m; i++) {
			for (int64_t j = 0; j < c.n; j++) {
				T s = T(0);
				for (int64_t p = 0; p < c.k; p++) {
					s = wadd(s, wmul(a[i * c.a.sr + p * c.a.sc], b[p * c.b.sr + j * c.b.sc]));
				}
				T &out = z[i * c.cr + j];
				out = beta1 ? wadd(out, s) : s;
			}
		}
	}
}

// Per-batch matrix-vector products (n = 1 or m = 1) up to this many multiply-adds run as loops: a BLAS call per
// batch costs about a microsecond, as much as the product of a few thousand elements.
constexpr int64_t kSmallMatvec = int64_t(1) << 16;

// C[b] (+)= A[b] * B[b] for batches [b0, b1) of matrix-vector products (c.n == 1: C = A x, or c.m == 1: C = x B):
// along the product's unit-stride direction where there is one (a scaled column or row added per k, which
// vectorizes), else a dot product per element. Each element sums its k products in order, as BLAS does.
template <class T>
void matvec_batches(const Contraction &c, const T *A, const T *Bm, T *C, int64_t b0, int64_t b1, bool beta1) {
	const bool col = c.n == 1; // C[i] = sum_p A[i, p] B[p]; else C[j] = sum_p A[p] B[p, j]
	const int64_t len = col ? c.m : c.n;
	const int64_t ms = col ? c.a.sr : c.b.sc; // the matrix's stride along the output
	const int64_t ks = col ? c.a.sc : c.b.sr; // and along k
	const int64_t vs = col ? c.b.sr : c.a.sc; // the vector's stride along k
	const int64_t zs = col ? c.cr : 1;
	for (int64_t bi = b0; bi < b1; bi++) {
		const T *mat = col ? A + bi * c.a.sb : Bm + bi * c.b.sb;
		const T *vec = col ? Bm + bi * c.b.sb : A + bi * c.a.sb;
		T *z = C + bi * c.cb;
		if (ms == 1 && zs == 1) {
			if (!beta1) {
				std::fill(z, z + len, T(0));
			}
			for (int64_t p = 0; p < c.k; p++) {
				const T v = vec[p * vs];
				const T *row = mat + p * ks;
				for (int64_t i = 0; i < len; i++) {
					z[i] = wadd(z[i], col ? wmul(row[i], v) : wmul(v, row[i]));
				}
			}
			continue;
		}
		for (int64_t i = 0; i < len; i++) {
			T acc = T(0);
			for (int64_t p = 0; p < c.k; p++) {
				acc = wadd(acc, col ? wmul(mat[i * ms + p * ks], vec[p * vs]) : wmul(vec[p * vs], mat[i * ms + p * ks]));
			}
			T &out = z[i * zs];
			out = beta1 ? wadd(out, acc) : acc;
		}
	}
}

// C[b] (+)= A[b] * B[b] for a product with k = 1 and n = 1 (a column scaled by one element: 'abc,->abc') or
// m = 1 (one element times a row): a loop over the vector, its unit strides spelled out so it vectorizes, split
// over the threads by batches or, for one batch, by slices of the vector. As a GEMM with k = n = 1 it was one
// BLAS call per 16 rows (a 2M-element float32 scaling took 5.7 ms, against ~1 ms for the loop).
template <class T>
void scaled_vectors(const Contraction &c, const T *A, const T *Bm, T *C, bool beta1, ThreadBudget *budget, int got) {
	const bool col = c.n == 1;
	const int64_t len = col ? c.m : c.n;
	const int64_t vs = col ? c.a.sr : c.b.sc; // the vector's stride
	const int64_t zs = col ? c.cr : 1;        // and the output's
	const auto run = [&](int64_t bi, int64_t i0, int64_t i1) {
		const T *v = col ? A + bi * c.a.sb : Bm + bi * c.b.sb;
		const T e = col ? Bm[bi * c.b.sb] : A[bi * c.a.sb];
		T *z = C + bi * c.cb;
		if (vs == 1 && zs == 1) {
			if (beta1) {
				for (int64_t i = i0; i < i1; i++) {
					z[i] = wadd(z[i], col ? wmul(v[i], e) : wmul(e, v[i]));
				}
			} else {
				for (int64_t i = i0; i < i1; i++) {
					z[i] = col ? wmul(v[i], e) : wmul(e, v[i]);
				}
			}
			return;
		}
		for (int64_t i = i0; i < i1; i++) {
			const T p = col ? wmul(v[i * vs], e) : wmul(e, v[i * vs]);
			z[i * zs] = beta1 ? wadd(z[i * zs], p) : p;
		}
	};
	if (c.nb >= got) {
		parallel_chunks(budget, got, c.nb, [&](int64_t b0, int64_t b1) {
			for (int64_t bi = b0; bi < b1; bi++) {
				run(bi, 0, len);
			}
		});
		return;
	}
	for (int64_t bi = 0; bi < c.nb; bi++) {
		parallel_chunks(budget, got, len, [&](int64_t i0, int64_t i1) { run(bi, i0, i1); });
	}
}

// Batched dot products (m = n = 1, k over kTinyGemm: a row-wise sum of products 'abc,abc->ab', a column-wise
// one 'ab,ab->b'), as loops rather than a 1 x 1 x k GEMM call per batch (4096 calls for a softmax's backward
// row sums: ~1.5 ms against numpy's 0.4). Contiguous along k: each dot is summed pairwise (PairwiseSum, numpy's
// shape); contiguous along the batches: rows of products are added as PairwiseRows sums them (the same error
// growth). The caller has checked the layout: unit strides along k, or along the batches.
template <class T>
void batched_dots(const Contraction &c, const T *A, const T *Bm, T *C, bool beta1, ThreadBudget *budget, int got) {
	const int64_t as = c.a.sc, bs = c.b.sr; // strides along k
	if (as == 1 && bs == 1) {
		parallel_chunks(budget, got, c.nb, [&](int64_t b0, int64_t b1) {
			for (int64_t bi = b0; bi < b1; bi++) {
				const T *a = A + bi * c.a.sb;
				const T *b = Bm + bi * c.b.sb;
				T s = T(0);
				if constexpr (kPairwise<T>) {
					PairwiseSum<T> sum;
					sum.add_run(c.k, 0, 0, 1, 1, [a, b](int64_t i, int64_t j) { return wmul(a[i], b[j]); });
					s = sum.total();
				} else {
					for (int64_t p = 0; p < c.k; p++) {
						s = wadd(s, wmul(a[p], b[p]));
					}
				}
				T &z = C[bi * c.cb];
				z = beta1 ? wadd(z, s) : s;
			}
		});
		return;
	}
	using Rows = PairwiseRows<T>;
	const int64_t tiles = (c.nb + Rows::kTile - 1) / Rows::kTile;
	parallel_chunks(budget, got, tiles, [&](int64_t t0, int64_t t1) {
		Rows rows(c.k, c.nb);
		T *leaf = rows.leaf();
		for (int64_t tile = t0; tile < t1; tile++) {
			const int64_t j0 = tile * Rows::kTile, w = std::min(Rows::kTile, c.nb - j0);
			rows.start(w);
			for (int64_t p0 = 0; p0 < c.k; p0 += Rows::kRun) {
				const int64_t p1 = std::min(c.k, p0 + Rows::kRun);
				for (int64_t p = p0; p < p1; p++) {
					const T *a = A + p * as + j0;
					const T *b = Bm + p * bs + j0;
					if (p == p0) {
						for (int64_t j = 0; j < w; j++) {
							leaf[j] = wmul(a[j], b[j]);
						}
					} else {
						for (int64_t j = 0; j < w; j++) {
							leaf[j] = wadd(leaf[j], wmul(a[j], b[j]));
						}
					}
				}
				rows.carry();
			}
			rows.total(C + j0, beta1);
		}
	});
}

} // namespace

int gemm_threads_wanted(double flops, int total) {
	const double w = flops / kFlopsPerThread;
	return w >= total ? total : (w < 1 ? 1 : static_cast<int>(w));
}

template <class T>
void contract_native(const Contraction &c, const T *x, const T *y, T *z, bool accumulate, ThreadBudget *budget,
                     GemmScratch &s, bool packed_out) {
	packed_out = packed_out && c.pack_c;
	if (c.empty || c.nb * c.m * c.n == 0) {
		if (!accumulate && c.out_numel) {
			std::memset(static_cast<void *>(z), 0, c.out_numel * sizeof(T));
		}
		return;
	}
	const KernelPath path = s.path;
	Control *ctl = s.control != nullptr ? s.control : control_of(budget);
	if (ctl != nullptr) {
		ctl->check(c.fn);
		ctl->announce(c.flops);
	}
	const T *A = c.swap ? y : x;
	const T *Bm = c.swap ? x : y;
	if (c.a.pack) {
		A = pack<T>(c.a, A, s.a, budget);
	}
	if (c.b.pack) {
		Bm = pack<T>(c.b, Bm, s.b, budget);
	}
	if (c.tiled && !packed_out) {
		const int64_t tiles = c.bt.count * c.mt.count * c.nt.count;
		const double work = c.flops * (is_complex_v<T> ? 4.0 : 1.0) + 32.0 * static_cast<double>(c.out_numel);
		const int want = budget != nullptr ? gemm_threads_wanted(work, budget->total()) : 1;
		const int got = budget != nullptr ? budget->acquire(want) : 1;
		Lease lease {budget, got};
		if (got <= 1 || tiles <= 1) {
			Meter meter(ctl);
			run_tiles<T>(c, A, Bm, z, accumulate, 0, tiles, s.c, meter, path);
		} else {
			const int t = static_cast<int>(std::min<int64_t>(got, tiles));
			std::vector<std::exception_ptr> errors(static_cast<size_t>(t));
			budget->run(t, [&](int i) {
				try {
					AlignedBuf own;
					Meter meter(ctl);
					run_tiles<T>(c, A, Bm, z, accumulate, tiles * i / t, tiles * (i + 1) / t, i == 0 ? s.c : own,
					             meter, path);
				} catch (...) {
					errors[static_cast<size_t>(i)] = std::current_exception();
				}
			});
			for (const auto &e : errors) {
				if (e) {
					std::rethrow_exception(e);
				}
			}
		}
		check(ctl, c.fn);
		return;
	}
	T *C = c.pack_c && !packed_out
	           ? reinterpret_cast<T *>(s.c.resize(static_cast<size_t>(c.nb * c.m * c.n) * sizeof(T)))
	           : z;
	const bool beta1 = accumulate && (!c.pack_c || packed_out);

	// tiny batches (a Hadamard product, a broadcast scaling) and vectors scaled by one element are memory-bound
	// loops: threaded by their elements
	const bool tiny = c.nb > 1 && c.m * c.n * c.k <= kTinyGemm;
	const bool vector = c.k == 1 && (c.m == 1 || c.n == 1) && c.m * c.n > kTinyGemm;
	const bool dots = c.m == 1 && c.n == 1 && c.nb > 1 && c.k > kTinyGemm &&
	                  ((c.a.sc == 1 && c.b.sr == 1) || (c.a.sb == 1 && c.b.sb == 1 && c.cb == 1));
	const bool matvec = !tiny && !vector && !dots && c.nb > 1 && (c.n == 1 || c.m == 1) &&
	                    c.m * c.n * c.k <= kSmallMatvec;
	const double flops = c.flops * (is_complex_v<T> ? 4.0 : 1.0);
	const double elements =
	    static_cast<double>(c.nb * c.m * c.n) * (dots || matvec ? static_cast<double>(c.k) : 1.0);
	int want = budget == nullptr                    ? 1
	           : tiny || vector || dots || matvec ? loop_threads_wanted(elements, budget->total())
	                                              : gemm_threads_wanted(flops, budget->total());
	if (tiny || vector || dots || matvec) { // no more tokens than pieces of work (an idle one keeps a call waiting)
		const int64_t pieces = tiny || matvec ? c.nb
		                       : vector ? std::max<int64_t>(c.nb, c.n == 1 ? c.m : c.n)
		                       : (c.a.sc == 1 && c.b.sr == 1 ? c.nb
		                                                      : (c.nb + PairwiseRows<T>::kTile - 1) / PairwiseRows<T>::kTile);
		want = static_cast<int>(std::min<int64_t>(want, std::max<int64_t>(1, pieces)));
	}
	const int got = budget != nullptr ? budget->acquire(want) : 1;
	Lease lease {budget, got};
	if (dots) {
		Meter meter(ctl);
		if (!meter.stop()) {
			batched_dots<T>(c, A, Bm, C, beta1, budget, got);
			meter.add(flops);
		}
	} else if (vector) {
		Meter meter(ctl);
		if (!meter.stop()) {
			scaled_vectors<T>(c, A, Bm, C, beta1, budget, got);
			meter.add(2.0 * static_cast<double>(c.nb * c.m * c.n));
		}
	} else if (matvec) {
		parallel_chunks(budget, got, c.nb, [&](int64_t b0, int64_t b1) {
			Meter meter(ctl);
			if (!meter.stop()) {
				matvec_batches<T>(c, A, Bm, C, b0, b1, beta1);
				meter.add(2.0 * static_cast<double>(b1 - b0) * static_cast<double>(c.m * c.n * c.k));
			}
		});
	} else if (tiny) {
		parallel_chunks(budget, got, c.nb, [&](int64_t b0, int64_t b1) {
			Meter meter(ctl);
			if (!meter.stop()) {
				tiny_batches<T>(c, A, Bm, C, b0, b1, beta1);
				meter.add(2.0 * static_cast<double>(b1 - b0) * static_cast<double>(c.m * c.n * c.k));
			}
		});
	} else if (c.nb >= got || c.nb > 1) {
		parallel_chunks(budget, got, c.nb, [&](int64_t b0, int64_t b1) {
			Meter meter(ctl);
			for (int64_t bi = b0; bi < b1; bi++) {
				gemm_rows<T>(c, A + bi * c.a.sb, Bm + bi * c.b.sb, C + bi * c.cb, 0, c.m, beta1, meter, path);
			}
		});
	} else if (c.m >= c.n || !(std::is_floating_point_v<T> || is_complex_v<T>)) {
		// one batch: split C's rows in panels of 16 (each thread packs all of B, K x N)
		const int64_t panels = (c.m + 15) / 16;
		parallel_chunks(budget, got, panels, [&](int64_t p0, int64_t p1) {
			Meter meter(ctl);
			gemm_rows<T>(c, A, Bm, C, p0 * 16, std::min<int64_t>(p1 * 16, c.m), beta1, meter, path);
		});
	} else {
		// wide C (M < N): split its columns instead, so each thread packs its part of B and only the
		// smaller A (M x K) is packed twice, e.g. 200 x 20000 times 20000 x 2000 packs 16 MB twice, not 160
		const int64_t panels = (c.n + 15) / 16;
		parallel_chunks(budget, got, panels, [&](int64_t p0, int64_t p1) {
			const int64_t n0 = p0 * 16, n1 = std::min<int64_t>(p1 * 16, c.n);
			Meter meter(ctl);
			gemm_steps<T>(c, A, Bm + n0 * c.b.sc, C + n0, c.m, n1 - n0, c.cr, beta1, meter, path);
		});
	}
	check(ctl, c.fn);
	if (c.pack_c && !packed_out) {
		T *zp = z;
		const T *src = C;
		// on the tokens the GEMM held (taking more while holding some could wait on a call that waits on us)
		const int64_t numel = c.nb * c.m * c.n;
		const int threads = std::min(got, permute_threads_wanted(budget, numel, outer_size(c.unpack)));
		if (accumulate) {
			permute_on(budget, threads, c.unpack.data(), c.unpack.size(), src, zp,
			           [](T &d, const T &v) { d = wadd(d, v); });
		} else {
			permute_on(budget, threads, c.unpack.data(), c.unpack.size(), src, zp);
		}
	}
}

#define TSK_CONTRACT(T)                                                                                              \
	template void contract_native<T>(const Contraction &, const T *, const T *, T *, bool, ThreadBudget *,             \
	                                 GemmScratch &, bool);
TSK_CONTRACT(float)
TSK_CONTRACT(double)
TSK_CONTRACT(int8_t)
TSK_CONTRACT(int16_t)
TSK_CONTRACT(int32_t)
TSK_CONTRACT(int64_t)
TSK_CONTRACT(c64)
TSK_CONTRACT(c128)
#undef TSK_CONTRACT

} // namespace tsk
