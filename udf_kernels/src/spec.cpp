#include "spec.hpp"

namespace tsk {


namespace {

// The whole character (UTF-8 code point) whose first byte is s[k], for an error message: quoting one byte of a
// multi-byte label would make the message invalid UTF-8. A byte that starts no valid sequence becomes U+FFFD.
std::string char_at(const std::string &s, size_t k) {
	const size_t len = utf8_len(s.data(), s.size(), k);
	return len == 0 ? std::string("\xEF\xBF\xBD") : s.substr(k, len);
}

} // namespace

Spec parse_spec(const Bytes &s, int n_inputs, const char *fn) {
	Spec spec;
	spec.n_inputs = n_inputs;
	spec.text = s.str();
	std::string t;
	for (char c : spec.text) {
		if (c != ' ') {
			t += c;
		}
	}
	const std::string where = std::string(fn) + ": bad spec " + quoted(valid_utf8(spec.text)) + ": ";
	size_t arrow = t.find("->");
	if (arrow == std::string::npos || t.find("->", arrow + 2) != std::string::npos) {
		fail(where + "expected exactly one '->' (e.g. " + (n_inputs == 2 ? "'ij,jk->ik'" : "'ij->ji'") + ")");
	}
	std::string lhs = t.substr(0, arrow);
	spec.output = t.substr(arrow + 2);
	std::vector<std::string> parts;
	size_t start = 0;
	while (true) {
		size_t comma = lhs.find(',', start);
		parts.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
		if (comma == std::string::npos) {
			break;
		}
		start = comma + 1;
	}
	if (static_cast<int>(parts.size()) != n_inputs) {
		fail(where + "expected " + std::to_string(n_inputs) + " operand(s) before '->', got " +
		     std::to_string(parts.size()));
	}
	bool seen[kNumLabels] = {};
	for (int i = 0; i < n_inputs; i++) {
		const std::string &part = parts[static_cast<size_t>(i)];
		for (size_t k = 0; k < part.size(); k++) {
			int l = label_index(part[k]);
			if (l < 0) {
				fail(where + "invalid label " + quoted(char_at(part, k)) + " (labels are letters a-z, A-Z)");
			}
			seen[l] = true;
		}
		spec.inputs[i] = part;
	}
	bool in_out[kNumLabels] = {};
	for (size_t k = 0; k < spec.output.size(); k++) {
		const char c = spec.output[k];
		int l = label_index(c);
		if (l < 0) {
			fail(where + "invalid output label " + quoted(char_at(spec.output, k)) + " (labels are letters a-z, A-Z)");
		}
		if (in_out[l]) {
			fail(where + "output label " + quoted(std::string(1, c)) + " appears twice");
		}
		if (!seen[l]) {
			fail(where + "output label " + quoted(std::string(1, c)) + " does not appear in any input");
		}
		in_out[l] = true;
	}
	return spec;
}

Plan make_plan(const Spec &spec, const Shape *const shapes[], const char *const names[], size_t itemsize,
               const char *fn) {
	int64_t size[kNumLabels];
	int origin_op[kNumLabels];
	size_t origin_dim[kNumLabels];
	int64_t stride[2][kNumLabels] = {};
	bool in_out[kNumLabels] = {};
	std::vector<int> order; // labels in order of first appearance
	for (int l = 0; l < kNumLabels; l++) {
		size[l] = -1;
		origin_op[l] = 0;
		origin_dim[l] = 0;
	}
	for (int i = 0; i < spec.n_inputs; i++) {
		const std::string &labels = spec.inputs[i];
		const Shape &shape = *shapes[i];
		if (labels.size() != shape.size()) {
			fail(std::string(fn) + ": operand " + names[i] + " has rank " + std::to_string(shape.size()) +
			     " (shape " + shape_str(shape) + ") but spec '" + spec.text + "' gives it " +
			     std::to_string(labels.size()) + " label(s) '" + labels + "'");
		}
		std::vector<int64_t> dim_stride(labels.size());
		int64_t st = 1;
		for (size_t k = labels.size(); k-- > 0;) {
			dim_stride[k] = st;
			st *= shape[k]; // cannot overflow: the operand's numel was validated
		}
		for (size_t k = 0; k < labels.size(); k++) {
			int l = label_index(labels[k]);
			int64_t d = shape[k];
			if (size[l] < 0) {
				size[l] = d;
				origin_op[l] = i;
				origin_dim[l] = k;
				order.push_back(l);
			} else if (size[l] != d) {
				fail(std::string(fn) + ": label '" + labels[k] + "' has size " + std::to_string(size[l]) +
				     " in operand " + names[origin_op[l]] + " (dim " + std::to_string(origin_dim[l]) + ") but " +
				     std::to_string(d) + " in operand " + names[i] + " (dim " + std::to_string(k) + ")");
			}
			stride[i][l] += dim_stride[k];
		}
	}
	Plan plan;
	for (char c : spec.output) {
		int l = label_index(c);
		in_out[l] = true;
		plan.outer.push_back(Loop {size[l], stride[0][l], stride[1][l]});
		plan.out_shape.push_back(size[l]);
	}
	for (int l : order) {
		if (!in_out[l]) {
			plan.inner.push_back(Loop {size[l], stride[0][l], stride[1][l]});
			plan.inner_labels += label_char(l);
		}
	}
	plan.out_numel = checked_numel(plan.out_shape, itemsize, fn, "output shape");
	// Reject an absurd total iteration count (product of every label size).
	uint64_t iters = 1;
	bool empty = false;
	for (int l : order) {
		if (size[l] == 0) {
			empty = true;
		}
	}
	if (!empty) {
		for (int l : order) {
			if (__builtin_mul_overflow(iters, static_cast<uint64_t>(size[l]), &iters) || iters > kMaxIterations) {
				fail(std::string(fn) + ": spec '" + spec.text + "' needs too many iterations for these shapes");
			}
		}
	}
	return plan;
}

} // namespace tsk
