// ggml's weight formats as brisk writes them (ggml_quants.h), read back by
// the tests' own dequantizer (gguf_reader.h, after ggml's dequantize_row_*):
// each type's error on rows of several shapes of distribution, the order of
// the types (more bits, less error; Q4_K below Q4_0 at the same 4.5 bits
// per weight, which is what its fitted scales and minimums are for, and far
// below it on one-signed rows, which its minimums are for), and
// rows that are all zeros, constant, one-signed or with outliers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "brisk/export/ggml_quants.h"
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

std::vector<Rows> distributions() {
  std::mt19937_64 rng(2024);
  const int64_t n = 4096;
  std::normal_distribution<float> normal(0.f, 1.f);
  std::exponential_distribution<float> expo(1.f);
  std::uniform_real_distribution<float> uniform(0.1f, 1.f);
  std::vector<Rows> rows = {{"normal 0.02", {}, true}, {"normal 1", {}, true}, {"laplace", {}, true},
                            {"outliers", {}, true},    {"positive", {}, false}, {"negative, offset", {}, false}};
  for (int64_t i = 0; i < n; ++i) {
    rows[0].x.push_back(0.02f * normal(rng));  // a trained weight's scale
    rows[1].x.push_back(normal(rng));
    rows[2].x.push_back((rng() & 1 ? 1.f : -1.f) * expo(rng));
    rows[3].x.push_back(normal(rng) * (i % 97 == 5 ? 12.f : 1.f));  // 1% of values 12x the rest
    rows[4].x.push_back(uniform(rng));
    rows[5].x.push_back(-2.f + 0.3f * normal(rng));
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
  const Bound bounds[] = {{Type::f16, 4e-4}, {Type::q8_0, 0.012}, {Type::q6_K, 0.04},
                          {Type::q5_K, 0.05}, {Type::q4_K, 0.10},  {Type::q4_0, 0.16}};
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
      // the values take, Q4_0 half of them on the other sign.
      EXPECT_LT(2 * error[4], error[5]) << r.name << ": q4_K against q4_0";
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
