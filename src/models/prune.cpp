// Magnitude and 2:4 pruning of a GPT's block weights, the sparsity count and
// the mask kept during fine-tuning (prune.h).
#include "brisk/models/prune.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "brisk/core/error.h"

namespace brisk::models {

using core::ConfigError;

PruneMethod parse_prune_method(const std::string& name) {
  if (name == "magnitude") return PruneMethod::magnitude;
  if (name == "2:4") return PruneMethod::two_four;
  throw ConfigError("unknown pruning method '" + name + "' (allowed: magnitude, 2:4)");
}

const char* prune_method_name(PruneMethod m) { return m == PruneMethod::two_four ? "2:4" : "magnitude"; }

PruneScope parse_prune_scope(const std::string& name) {
  if (name == "layer") return PruneScope::layer;
  if (name == "global") return PruneScope::global;
  throw ConfigError("unknown pruning scope '" + name + "' (allowed: layer, global)");
}

const char* prune_scope_name(PruneScope s) { return s == PruneScope::global ? "global" : "layer"; }

bool is_prunable(const std::string& name) {
  if (name.rfind("h.", 0) != 0) return false;  // block parameters only
  for (const char* s : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    const size_t n = std::strlen(s);
    if (name.size() > n && name.compare(name.size() - n, n, s) == 0) return true;
  }
  return false;
}

int64_t PruneReport::zeros() const {
  int64_t z = 0;
  for (const LayerSparsity& l : layers) z += l.zeros;
  return z;
}

int64_t PruneReport::numel() const {
  int64_t n = 0;
  for (const LayerSparsity& l : layers) n += l.numel();
  return n;
}

double PruneReport::sparsity() const { return numel() ? double(zeros()) / double(numel()) : 0.0; }

namespace {

struct Span {
  float* w;
  int64_t n;
};

// Zeroes the round(sparsity x n) entries of the spans (n entries in all) that
// come first in the strict order (|w|, position), a position running through
// the spans one after another, so equal magnitudes (zeros above all) are cut
// in position order and the count is exact. The k-th magnitude is found on
// one copy of the magnitudes (4 bytes a weight); every entry below it goes,
// and of those equal to it the first ones. Returns the count.
int64_t zero_smallest(const std::vector<Span>& spans, double sparsity) {
  int64_t n = 0;
  for (const Span& s : spans) n += s.n;
  const auto k = std::min<int64_t>(n, std::llround(sparsity * double(n)));
  if (k <= 0) return 0;
  std::vector<float> mags;
  mags.reserve(size_t(n));
  for (const Span& s : spans)
    for (int64_t i = 0; i < s.n; ++i) mags.push_back(std::fabs(s.w[i]));
  std::nth_element(mags.begin(), mags.begin() + (k - 1), mags.end());
  const float cut = mags[size_t(k - 1)];
  int64_t equal_to_cut = k;  // how many entries of magnitude `cut` go: k less those below it
  for (const float a : mags) equal_to_cut -= a < cut;
  for (const Span& s : spans)
    for (int64_t i = 0; i < s.n; ++i) {
      const float a = std::fabs(s.w[i]);
      if (a < cut || (a == cut && equal_to_cut-- > 0)) s.w[i] = 0.0f;
    }
  return k;
}

}  // namespace

int64_t prune_magnitude(float* w, int64_t n, double sparsity) { return zero_smallest({{w, n}}, sparsity); }

void prune_two_four(float* w, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c + 4 <= cols; c += 4) {
      float* g = w + r * cols + c;
      // Rank the four by |w| (ties: lower index first) and zero the two smallest.
      int order[4] = {0, 1, 2, 3};
      std::sort(order, order + 4, [g](int a, int b) {
        const float fa = std::fabs(g[a]), fb = std::fabs(g[b]);
        return fa > fb || (fa == fb && a < b);
      });
      g[order[2]] = 0.0f;
      g[order[3]] = 0.0f;
    }
  }
}

namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

int64_t count_zeros(const float* w, int64_t n) {
  int64_t z = 0;
  for (int64_t i = 0; i < n; ++i) z += w[i] == 0.0f;
  return z;
}

// The entry's weight as a matrix, checked: the GPT's are 2-D f32.
void check_matrix(const std::string& name, const core::Tensor& t) {
  if (t.shape().rank() != 2 || t.dtype() != core::DType::f32)
    throw ConfigError("cannot prune '" + name + "': expected a 2-D f32 weight, got " + t.meta().str());
}

}  // namespace

void check_prune_options(PruneMethod method, double sparsity, PruneScope scope) {
  if (!(sparsity >= 0.0 && sparsity < 1.0))  // also rejects NaN
    throw ConfigError("pruning sparsity must be in [0, 1), got " + number(sparsity));
  if (method == PruneMethod::two_four && sparsity != 0.5)
    throw ConfigError("2:4 pruning keeps 2 of every 4 weights, so its sparsity is 0.5; got " + number(sparsity) +
                      " (use method magnitude for other sparsities)");
  if (method == PruneMethod::two_four && scope == PruneScope::global)
    throw ConfigError("2:4 pruning chooses within groups of 4 weights of one row, so it has no global scope; use "
                      "scope layer, or method magnitude with scope global");
}

PruneReport prune(core::ParameterStore& store, PruneMethod method, double sparsity, PruneScope scope) {
  check_prune_options(method, sparsity, scope);
  PruneReport report;
  report.method = prune_method_name(method);
  if (method == PruneMethod::magnitude) report.scope = prune_scope_name(scope);
  report.requested = sparsity;
  report.model_params = store.num_params();
  // Every shape is checked before any weight changes, so a refused model is left as it was.
  for (const auto& [name, e] : store.entries()) {
    if (!is_prunable(name)) continue;
    check_matrix(name, e.value);
    if (method == PruneMethod::two_four && e.value.shape()[1] % 4 != 0)
      throw ConfigError("cannot 2:4-prune '" + name + "': its rows hold " + std::to_string(e.value.shape()[1]) +
                        " weights, not a multiple of 4");
  }
  // A host store is pruned in place (download() of a host tensor is the
  // tensor itself); a device store through host copies.
  std::vector<core::Tensor> ws;  // the prunable weights' host forms, in store order
  size_t i = 0;
  for (const auto& [name, e] : store.entries())
    if (is_prunable(name)) ws.push_back(store.download(e.value));
  // Magnitudes order the weights; a NaN has none (the cut would go wrong
  // silently), and an infinite weight means the checkpoint is damaged.
  i = 0;
  for (const auto& [name, e] : store.entries()) {
    if (!is_prunable(name)) continue;
    const core::Tensor& w = ws[i++];
    const float* p = w.data_as<float>();
    for (int64_t k = 0; k < w.numel(); ++k)
      if (!std::isfinite(p[k]))
        throw ConfigError("cannot prune '" + name + "': weight " + std::to_string(k) + " is " +
                          (std::isnan(p[k]) ? "NaN" : "infinite") + " (a diverged or damaged checkpoint)");
  }
  if (method == PruneMethod::two_four) {
    for (core::Tensor& w : ws) prune_two_four(w.data_as<float>(), w.shape()[0], w.shape()[1]);
  } else if (scope == PruneScope::global) {
    std::vector<Span> spans;
    for (core::Tensor& w : ws) spans.push_back({w.data_as<float>(), w.numel()});
    zero_smallest(spans, sparsity);
  } else {
    for (core::Tensor& w : ws) prune_magnitude(w.data_as<float>(), w.numel(), sparsity);
  }
  i = 0;
  for (const auto& [name, e] : store.entries()) {
    if (!is_prunable(name)) continue;
    const core::Tensor& w = ws[i++];
    if (store.on_device()) store.upload(e.value, w);
    report.layers.push_back({name, w.shape()[0], w.shape()[1], count_zeros(w.data_as<float>(), w.numel())});
  }
  if (report.layers.empty()) throw ConfigError("nothing to prune: the model has no block Linear weights");
  return report;
}

PruneReport sparsity_report(const core::ParameterStore& store) {
  PruneReport report;
  report.model_params = store.num_params();
  for (const auto& [name, e] : store.entries()) {
    if (!is_prunable(name)) continue;
    check_matrix(name, e.value);
    const core::Tensor w = store.download(e.value);
    report.layers.push_back({name, w.shape()[0], w.shape()[1], count_zeros(w.data_as<float>(), w.numel())});
  }
  return report;
}

PruneMask PruneMask::from_zeros(const core::ParameterStore& store) {
  if (store.on_device())
    throw ConfigError("keeping a pruning mask needs the weights in host memory (train.device = \"cpu\")");
  PruneMask mask;
  for (const auto& [name, e] : store.entries()) {
    if (!is_prunable(name)) continue;
    check_matrix(name, e.value);
    const int64_t n = e.value.numel();
    if (uint64_t(n) > std::numeric_limits<uint32_t>::max())
      throw ConfigError("cannot keep the pruning mask of '" + name + "': " + std::to_string(n) +
                        " weights, more than 2^32 - 1");
    MaskedWeight t{name, {}};
    const float* w = e.value.data_as<float>();
    for (int64_t i = 0; i < n; ++i)
      if (w[i] == 0.0f) t.zeros.push_back(uint32_t(i));
    t.zeros.shrink_to_fit();
    mask.masked_ += int64_t(t.zeros.size());
    mask.prunable_ += n;
    if (!t.zeros.empty()) mask.tensors_.push_back(std::move(t));
  }
  return mask;
}

void PruneMask::apply(core::ParameterStore& store) const {
  for (const MaskedWeight& t : tensors_) {
    core::ParameterStore::Entry& e = store.at(t.name);
    float* w = e.value.data_as<float>();
    for (uint32_t i : t.zeros) w[i] = 0.0f;
    // Moments have the weight's shape (AdamW's m and v); anything else is not indexed like it.
    for (core::Tensor& s : e.state) {
      if (s.numel() != e.value.numel() || s.dtype() != core::DType::f32) continue;
      float* m = s.data_as<float>();
      for (uint32_t i : t.zeros) m[i] = 0.0f;
    }
  }
}

}  // namespace brisk::models
