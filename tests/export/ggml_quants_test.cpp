// ggml's weight formats as brisk writes them (ggml_quants.h):
//   - byte for byte what ggml's own reference quantizers write, compared
//     with llama.cpp's library (libggml-base.so of npm node-llama-cpp,
//     loaded with dlopen) on rows of many shapes of distribution;
//   - read back by the tests' own dequantizer (gguf_reader.h, after ggml's
//     dequantize_row_*): each type's error, the order of the types (more
//     bits, less error; Q4_K below Q4_0 at the same 4.5 bits per weight,
//     which its fitted scales are for, and far below it on one-signed rows,
//     which its minimums are for), and rows that are all zeros, tiny or
//     constant;
//   - values too large for a format's f16 scales are refused.
// The random rows come from the test's own generator (std's distributions
// differ between standard libraries).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "brisk/export/ggml_quants.h"
#include "export_test_util.h"
#include "gguf_reader.h"

using namespace brisk;
using exporter::ggml::Type;

namespace {

std::vector<float> round_trip(Type t, const std::vector<float>& x) {
  export_test::GgufTensor g;
  g.type = uint32_t(t);
  g.dims = {uint64_t(x.size())};
  g.bytes.resize(exporter::ggml::row_bytes(t, int64_t(x.size())));
  exporter::ggml::quantize(t, x.data(), int64_t(x.size()), g.bytes.data());
  return export_test::dequantize(g);
}

// ||dequantized - x|| / ||x||
double relative_error(Type t, const std::vector<float>& x) {
  const std::vector<float> y = round_trip(t, x);
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_TRUE(std::isfinite(y[i])) << exporter::ggml::type_name(t) << " value " << i;
    num += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
    den += double(x[i]) * x[i];
  }
  return std::sqrt(num / den);
}

struct Rows {
  const char* name;
  std::vector<float> x;
  bool centred;  // mean 0: the symmetric formats (q8_0, q6_K, q4_0) lose nothing to an offset
};

// Uniform in [0, 1) and standard normal values from mt19937_64, whose
// output the standard fixes.
struct Random {
  std::mt19937_64 rng;
  explicit Random(uint64_t seed) : rng(seed) {}
  double uniform() { return double(rng() >> 11) * 0x1.0p-53; }
  float normal() {  // Box-Muller
    const double u = 1.0 - uniform(), v = uniform();
    return float(std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v));
  }
};

std::vector<Rows> distributions() {
  Random r(2024);
  const int64_t n = 4096;
  std::vector<Rows> rows = {{"normal 0.02", {}, true}, {"normal 1", {}, true}, {"laplace", {}, true},
                            {"outliers", {}, true},    {"positive", {}, false}, {"negative, offset", {}, false}};
  for (int64_t i = 0; i < n; ++i) {
    rows[0].x.push_back(0.02f * r.normal());  // a trained weight's scale
    rows[1].x.push_back(r.normal());
    rows[2].x.push_back(float((r.rng() & 1 ? 1.0 : -1.0) * -std::log(1.0 - r.uniform())));
    rows[3].x.push_back(r.normal() * (i % 97 == 5 ? 12.f : 1.f));  // 1% of values 12x the rest
    rows[4].x.push_back(float(0.1 + 0.9 * r.uniform()));
    rows[5].x.push_back(-2.f + 0.3f * r.normal());
  }
  return rows;
}

}  // namespace

TEST(GgmlQuants, EachTypeReadsBackWithinItsErrorAndMoreBitsErrLess) {
  struct Bound {
    Type type;
    double max_error;  // relative RMS error on every distribution
  };
  // f16: 2^-11 relative rounding; q8_0: a step of max/127 per 32; the
  // K-quants: 6, 5 and 4 bits with fitted scales.
  // Measured (the largest over the rows): f16 2e-4, q8_0 0.010, q6_K
  // 0.028, q5_K 0.048, q4_K 0.096, q4_0 0.154; the bounds leave a quarter more.
  const Bound bounds[] = {{Type::f16, 3e-4}, {Type::q8_0, 0.014}, {Type::q6_K, 0.04},
                          {Type::q5_K, 0.06}, {Type::q4_K, 0.12},  {Type::q4_0, 0.2}};
  for (const Rows& r : distributions()) {
    double error[6];
    for (int i = 0; i < 6; ++i) {
      error[i] = relative_error(bounds[i].type, r.x);
      std::printf("%-18s %-5s relative RMS error %.4f\n", r.name, exporter::ggml::type_name(bounds[i].type), error[i]);
      EXPECT_LT(error[i], bounds[i].max_error) << r.name << " " << exporter::ggml::type_name(bounds[i].type);
      EXPECT_GT(error[i], 0) << r.name << " " << exporter::ggml::type_name(bounds[i].type) << ": no rounding at all?";
    }
    if (r.centred) {
      for (int i = 1; i < 6; ++i)
        EXPECT_LT(error[i - 1], error[i]) << r.name << ": " << exporter::ggml::type_name(bounds[i - 1].type)
                                          << " should err less than " << exporter::ggml::type_name(bounds[i].type);
    } else {
      // One-signed rows: Q4_K's minimum spends all 16 levels on the range
      // the values take, Q4_0 half of them on the other sign (measured: 2x
      // and 4x less error).
      EXPECT_LT(1.5 * error[4], error[5]) << r.name << ": q4_K against q4_0";
    }
  }
}

TEST(GgmlQuants, ZeroConstantAndTinyRowsReadBackExactlyOrAsZeros) {
  for (Type t : {Type::q8_0, Type::q4_0, Type::q4_K, Type::q5_K, Type::q6_K}) {
    const char* name = exporter::ggml::type_name(t);
    for (float v : round_trip(t, std::vector<float>(512, 0.f))) ASSERT_EQ(v, 0.f) << name << ": zeros";
    // Values far below f16's range round to zero rather than to NaN or Inf.
    for (float v : round_trip(t, std::vector<float>(512, 1e-20f))) ASSERT_NEAR(v, 0.f, 1e-19f) << name << ": tiny";
    // A constant row: one level of every format holds it to f16 precision.
    for (float c : {0.5f, -0.75f})
      for (float v : round_trip(t, std::vector<float>(512, c))) ASSERT_NEAR(v, c, std::fabs(c) * 2e-3) << name;
  }
}

TEST(GgmlQuants, ARowOfPartBlocksIsRefused) {
  std::vector<float> x(300, 1.f);
  std::vector<uint8_t> out(4096);
  EXPECT_THROW(exporter::ggml::quantize(Type::q4_K, x.data(), 300, out.data()), std::invalid_argument);
  EXPECT_THROW(exporter::ggml::quantize(Type::q8_0, x.data(), 33, out.data()), std::invalid_argument);
  EXPECT_EQ(exporter::ggml::row_bytes(Type::q4_K, 512), 288u);
  EXPECT_EQ(exporter::ggml::row_bytes(Type::q5_K, 256), 176u);
  EXPECT_EQ(exporter::ggml::row_bytes(Type::q6_K, 768), 630u);
}

// ggml's reference quantizers, from llama.cpp's own library.
using QuantizeRow = void (*)(const float*, void*, int64_t);

TEST(GgmlQuants, BytesAreGgmlsOwn) {
  const std::filesystem::path lib = std::filesystem::path(export_test::llama_npm_modules()) / "@node-llama-cpp" /
                                    "linux-x64" / "bins" / "linux-x64" / "libggml-base.so";
  void* handle = ::dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << "cannot load llama.cpp's " << lib << " (" << ::dlerror()
                             << "): run `bash scripts/fetch_data.sh` (`make test` does it)";
  struct Case {
    Type type;
    const char* symbol;
  };
  Random r(77);
  const int64_t n = 256 * 512;  // near-ties are rare: fused multiply-adds change about 1% of Q4_K blocks
  for (const Case& c : {Case{Type::q8_0, "quantize_row_q8_0_ref"}, Case{Type::q4_0, "quantize_row_q4_0_ref"},
                        Case{Type::q4_K, "quantize_row_q4_K_ref"}, Case{Type::q5_K, "quantize_row_q5_K_ref"},
                        Case{Type::q6_K, "quantize_row_q6_K_ref"}}) {
    const auto ggml = reinterpret_cast<QuantizeRow>(::dlsym(handle, c.symbol));
    ASSERT_NE(ggml, nullptr) << c.symbol << " not in " << lib;
    // Shapes whose near-ties and edges a difference in arithmetic would show.
    for (int shape = 0; shape < 9; ++shape) {
      std::vector<float> x(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const float g = r.normal();
        x[size_t(i)] = shape == 0   ? 0.02f * g
                       : shape == 1 ? g
                       : shape == 2 ? std::fabs(g)
                       : shape == 3 ? -2.f + 0.3f * g
                       : shape == 4 ? float(int(16 * r.uniform()) - 8) / 4  // many exact ties
                       : shape == 5 ? g * (i % 97 == 3 ? 50.f : 1.f)        // outliers
                       : shape == 6 ? ((i / 32) % 3 == 0 ? 0.f : g)         // zero sub-blocks
                       : shape == 7 ? 1e3f * g
                                    : 1e-6f * g;  // tiny
      }
      const size_t bytes = exporter::ggml::row_bytes(c.type, n);
      std::vector<uint8_t> mine(bytes), theirs(bytes);
      exporter::ggml::quantize(c.type, x.data(), n, mine.data());
      ggml(x.data(), theirs.data(), n);
      size_t differ = 0;
      for (size_t i = 0; i < bytes; ++i) differ += mine[i] != theirs[i];
      EXPECT_EQ(differ, 0u) << exporter::ggml::type_name(c.type) << " on row shape " << shape << ": " << differ
                            << " of " << bytes << " bytes differ from ggml's";
    }
  }
  ::dlclose(handle);
}

// A value so large that a block's f16 scale overflows is refused: the file
// would hold infinities (f16 above 65504; Q8_0 from about 8e6, the K-quants
// from about 3e6), and llama.cpp would compute with them.
TEST(GgmlQuants, ValuesPastTheF16ScalesAreRefused) {
  for (Type t : {Type::f16, Type::q8_0, Type::q4_0, Type::q4_K, Type::q5_K, Type::q6_K}) {
    std::vector<float> x(512, 0.5f);
    x[300] = t == Type::f16 ? 1e5f : 1e9f;
    std::vector<uint8_t> out(exporter::ggml::row_bytes(t, 512));
    try {
      exporter::ggml::quantize(t, x.data(), 512, out.data());
      ADD_FAILURE() << exporter::ggml::type_name(t) << " stored " << x[300];
    } catch (const std::range_error& e) {
      EXPECT_NE(std::string(e.what()).find("f16"), std::string::npos) << e.what();
    }
    x[300] = 1000.f;  // large, but every format holds it
    EXPECT_NO_THROW(exporter::ggml::quantize(t, x.data(), 512, out.data())) << exporter::ggml::type_name(t);
  }
}
