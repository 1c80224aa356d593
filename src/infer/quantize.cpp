// Weight quantization (model.h: quantize, save_quantized).
//
// int8: one scale per output row, max |w| / 127, codes rounded to nearest.
// int4 (llama.cpp's Q4_0): per group of 32, the scale is the group's
// largest-magnitude weight divided by -8, so that weight maps exactly to
// code -8 and the full range [-8, 7] is used.
//
// With calibration text, int4 first applies activation-aware scaling
// (AWQ, Lin et al. 2023) to the Linears that read a LayerNorm's output
// (attention qkv and MLP fc): input channels that carry large activations
// are scaled up in the weight before quantization, so they lose less to
// rounding, and the LayerNorm's weight and bias are divided by the same
// factors, which leaves the fp32 function unchanged. The factors are
// mean|x_j|^alpha with alpha chosen per layer from a grid by the error of
// the quantized layer's output on the calibration activations.
#include <cmath>
#include <array>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/infer/engine.h"
#include "brisk/infer/model.h"
#include "brisk/ops/quant.h"

namespace brisk::infer {

using core::DType;
using core::Shape;
using core::Tensor;

namespace {

QLinear quantize_int8(const QLinear& l) {
  QLinear q{Scheme::int8, l.out, l.in, Tensor::empty(Shape{l.out, l.in}, DType::i8), Tensor::empty(Shape{l.out}, DType::f32),
            l.bias};
  const float* w = l.w.data_as<float>();
  for (int64_t o = 0; o < l.out; ++o)
    q.scale.data_as<float>()[o] = ops::quant::quantize_int8(w + o * l.in, l.in, q.w.data_as<int8_t>() + o * l.in);
  return q;
}

QLinear quantize_int4(const QLinear& l) {
  const int64_t groups = l.in / ops::quant::kQ4Group;
  QLinear q{Scheme::int4, l.out, l.in, Tensor::empty(Shape{l.out, l.in / 2}, DType::u8),
            Tensor::empty(Shape{l.out, groups}, DType::f32), l.bias};
  const float* w = l.w.data_as<float>();
  for (int64_t o = 0; o < l.out; ++o)
    for (int64_t g = 0; g < groups; ++g) {
      const float* x = w + o * l.in + g * 32;
      float big = 0.f;  // the weight of largest magnitude, with its sign
      for (int j = 0; j < 32; ++j)
        if (std::fabs(x[j]) > std::fabs(big)) big = x[j];
      const float d = big / -8.f, inv = d != 0.f ? 1.f / d : 0.f;
      q.scale.data_as<float>()[o * groups + g] = d;
      uint8_t* codes = q.w.data_as<uint8_t>() + o * (l.in / 2) + g * 16;
      for (int j = 0; j < 16; ++j) {
        const int lo = int(std::clamp(std::nearbyint(x[j] * inv), -8.f, 7.f)) + 8;
        const int hi = int(std::clamp(std::nearbyint(x[j + 16] * inv), -8.f, 7.f)) + 8;
        codes[j] = uint8_t(lo | (hi << 4));
      }
    }
  return q;
}

// quantize() has checked int4's input widths, naming the Linear.
QLinear quantize_linear(const QLinear& l, Scheme s) { return s == Scheme::int8 ? quantize_int8(l) : quantize_int4(l); }

// A scale is the largest magnitude of a row or group: one NaN or infinite
// weight would turn its whole row into NaN codes without a word.
void require_finite(const QLinear& l, const std::string& name, const std::string& source) {
  const int64_t k = core::first_non_finite(l.w);
  if (k < 0) return;
  throw core::ConfigError(source + ": cannot quantize '" + name + "': it holds " +
                          (std::isnan(l.w.item(k)) ? "NaN" : "an infinity") + " at element " + std::to_string(k) +
                          " (a diverged or damaged model)");
}

// The fp32 weight a quantized Linear stands for.
std::vector<float> dequantize(const QLinear& q) {
  std::vector<float> w(size_t(q.out * q.in));
  const int64_t groups = q.in / ops::quant::kQ4Group;
  for (int64_t o = 0; o < q.out; ++o)
    for (int64_t i = 0; i < q.in; ++i)
      w[size_t(o * q.in + i)] =
          q.scheme == Scheme::int8
              ? float(q.w.data_as<int8_t>()[o * q.in + i]) * q.scale.data_as<float>()[o]
              : float(ops::quant::q4_code(q.w.data_as<uint8_t>() + o * (q.in / 2) + (i / 32) * 16, int(i % 32))) *
                    q.scale.data_as<float>()[o * groups + i / 32];
  return w;
}

// Calibration rows of one Linear's input: a sample for the error, and the mean |x_j|.
struct Calib {
  std::vector<float> rows;  // up to kRows x width
  std::vector<double> mean_abs;
  int64_t seen = 0;
};
constexpr int64_t kCalibRows = 256;

// ||X W^T - X W'^T||^2 over the sample rows, W' the quantized weight of `l`
// with input channels scaled by s (and X divided by s).
double scaled_error(const QLinear& l, const Calib& c, const std::vector<float>& s, Scheme scheme) {
  QLinear scaled = l;
  scaled.w = l.w.clone();
  float* w = scaled.w.data_as<float>();
  for (int64_t o = 0; o < l.out; ++o)
    for (int64_t i = 0; i < l.in; ++i) w[o * l.in + i] *= s[size_t(i)];
  const std::vector<float> deq = dequantize(quantize_linear(scaled, scheme));
  const float* w0 = l.w.data_as<float>();
  const int64_t n = int64_t(c.rows.size()) / l.in;
  double err = 0;
  for (int64_t r = 0; r < n; ++r) {
    const float* x = c.rows.data() + r * l.in;
    for (int64_t o = 0; o < l.out; ++o) {
      double a = 0, b = 0;
      for (int64_t i = 0; i < l.in; ++i) {
        a += double(x[i]) * w0[o * l.in + i];
        b += double(x[i]) / s[size_t(i)] * deq[size_t(o * l.in + i)];
      }
      err += (a - b) * (a - b);
    }
  }
  return err;
}

// Scales the Linear's input channels and divides the LayerNorm before it.
// Returns the alpha chosen (0: no scaling helped).
double apply_awq(QLinear& l, Tensor& ln_w, Tensor& ln_b, const Calib& c, Scheme scheme) {
  std::vector<float> best(size_t(l.in), 1.f);
  double best_err = scaled_error(l, c, best, scheme), best_alpha = 0;
  for (double alpha : {0.125, 0.25, 0.375, 0.5, 0.625, 0.75}) {
    std::vector<float> s(size_t(l.in));
    double lo = INFINITY, hi = 0;
    for (int64_t i = 0; i < l.in; ++i) {
      s[size_t(i)] = float(std::pow(std::max(c.mean_abs[size_t(i)], 1e-6), alpha));
      lo = std::min(lo, double(s[size_t(i)]));
      hi = std::max(hi, double(s[size_t(i)]));
    }
    const float norm = float(std::sqrt(lo * hi));  // keeps the factors around 1
    for (float& v : s) v /= norm;
    const double err = scaled_error(l, c, s, scheme);
    if (err < best_err) best_err = err, best = s, best_alpha = alpha;
  }
  if (best_alpha == 0) return 0;
  l.w = l.w.clone();
  ln_w = ln_w.clone();
  ln_b = ln_b.clone();
  for (int64_t o = 0; o < l.out; ++o)
    for (int64_t i = 0; i < l.in; ++i) l.w.data_as<float>()[o * l.in + i] *= best[size_t(i)];
  for (int64_t i = 0; i < l.in; ++i) {
    ln_w.data_as<float>()[i] /= best[size_t(i)];
    ln_b.data_as<float>()[i] /= best[size_t(i)];
  }
  return best_alpha;
}

// The LayerNorm outputs that feed qkv (which 0) and fc (which 2) of every layer.
std::vector<std::array<Calib, 2>> collect(const Model& m, const std::vector<int32_t>& tokens) {
  std::vector<std::array<Calib, 2>> calib(size_t(m.config.n_layer));
  for (auto& pair : calib)
    for (Calib& c : pair) c.mean_abs.assign(size_t(m.config.n_embd), 0.0);
  EngineOptions o;
  o.max_seqs = 1;
  o.max_step_tokens = m.config.block_size;
  Engine engine(m, o);
  engine.set_observer([&](int64_t layer, int which, const float* rows, int64_t n, int64_t width) {
    if (which != 0 && which != 2) return;
    Calib& c = calib[size_t(layer)][size_t(which / 2)];
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t i = 0; i < width; ++i) c.mean_abs[size_t(i)] += std::fabs(rows[r * width + i]);
      // Every k-th row into the sample, spread over the calibration text.
      if (int64_t(c.rows.size()) / width < kCalibRows && (c.seen + r) % 4 == 0)
        c.rows.insert(c.rows.end(), rows + r * width, rows + (r + 1) * width);
    }
    c.seen += n;
  });
  const int64_t window = m.config.block_size;
  for (size_t at = 0; at + 2 <= tokens.size(); at += size_t(window)) {
    const size_t end = std::min(tokens.size(), at + size_t(window));
    engine.score(std::vector<int32_t>(tokens.begin() + std::ptrdiff_t(at), tokens.begin() + std::ptrdiff_t(end)));
  }
  for (auto& pair : calib)
    for (Calib& c : pair)
      for (double& v : c.mean_abs) v /= double(std::max<int64_t>(c.seen, 1));
  return calib;
}

}  // namespace

Model quantize(const Model& m, Scheme s, const std::vector<int32_t>& calibration) {
  if (m.scheme != Scheme::f32)
    throw core::ConfigError(m.source + " is already quantized (" + scheme_name(m.scheme) +
                            "); quantize the fp32 checkpoint it came from");
  if (s == Scheme::f32) throw core::ConfigError("quantize needs a scheme: int8 or int4");
  if (m.head.packed)
    throw core::ConfigError(m.source + ": its weights are packed for the engine; quantize the model as loaded");
  auto check = [&](const QLinear& l, const std::string& name) {
    require_finite(l, name, m.source);
    if (s == Scheme::int4 && l.in % ops::quant::kQ4Group != 0)
      throw core::ConfigError(m.source + ": int4 needs every Linear's input width to be a multiple of " +
                              std::to_string(ops::quant::kQ4Group) + "; '" + name + "' takes " +
                              std::to_string(l.in) + " (use int8)");
  };
  check(m.head, "wte");
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    check(m.layers[l].qkv, h + "attn.c_attn");
    check(m.layers[l].proj, h + "attn.c_proj");
    check(m.layers[l].fc, h + "mlp.c_fc");
    check(m.layers[l].fc_proj, h + "mlp.c_proj");
  }
  Model q = m;
  std::string note = scheme_name(s);
  if (s == Scheme::int4 && !calibration.empty()) {
    const auto calib = collect(m, calibration);
    std::string alphas;
    for (size_t l = 0; l < q.layers.size(); ++l) {
      Layer& L = q.layers[l];
      const double a0 = apply_awq(L.qkv, L.ln1_w, L.ln1_b, calib[l][0], s);
      const double a1 = apply_awq(L.fc, L.ln2_w, L.ln2_b, calib[l][1], s);
      char buf[64];
      std::snprintf(buf, sizeof buf, "%s%.3g/%.3g", alphas.empty() ? "" : " ", a0, a1);
      alphas += buf;
    }
    note += ", AWQ from " + std::to_string(calibration.size()) + " calibration tokens (alpha qkv/fc per layer: " +
            alphas + ")";
  }
  q.scheme = s;
  q.quant_note = note;
  q.head = quantize_linear(m.head, s);
  for (Layer& L : q.layers)
    for (QLinear* l : {&L.qkv, &L.proj, &L.fc, &L.fc_proj}) *l = quantize_linear(*l, s);
  return q;
}

void save_quantized(const Model& m, const std::string& path) {
  if (m.scheme == Scheme::f32) throw core::ConfigError("save_quantized: the model is not quantized");
  std::vector<core::NamedTensor> t;
  auto put = [&](const std::string& name, const Tensor& x) { t.push_back({name, x.as_view()}); };
  auto put_linear = [&](const std::string& name, const QLinear& l) {
    put(name + ".weight", l.w);
    put(name + ".weight.scale", l.scale);
    if (l.bias.defined()) put(name + ".bias", l.bias);
  };
  put_linear("wte", m.head);
  put("wpe.weight", m.wpe);
  put("ln_f.weight", m.lnf_w);
  put("ln_f.bias", m.lnf_b);
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    const Layer& L = m.layers[i];
    put(p + "ln_1.weight", L.ln1_w);
    put(p + "ln_1.bias", L.ln1_b);
    put(p + "ln_2.weight", L.ln2_w);
    put(p + "ln_2.bias", L.ln2_b);
    put_linear(p + "attn.c_attn", L.qkv);
    put_linear(p + "attn.c_proj", L.proj);
    put_linear(p + "mlp.c_fc", L.fc);
    put_linear(p + "mlp.c_proj", L.fc_proj);
  }
  const nlohmann::json cfg = {{"vocab_size", m.config.vocab_size}, {"n_layer", m.config.n_layer},
                              {"n_embd", m.config.n_embd},         {"n_head", m.config.n_head},
                              {"block_size", m.config.block_size}};
  core::save_safetensors(path, t,
                         {{"brisk.scheme", scheme_name(m.scheme)},
                          {"brisk.model", cfg.dump()},
                          {"brisk.tokenizer", m.tokenizer},
                          {"brisk.calibration", m.quant_note},
                          {"brisk.layout", "Linear weights (out, in); int8: per-row scale (out); int4: Q4_0 codes "
                                           "(out, in/2), scale (out, in/32); wte is the tied LM head"}});
}

}  // namespace brisk::infer
