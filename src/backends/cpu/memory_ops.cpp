// CPU kernels for cast (and cast_many, tensor by tensor), fill, copy (every
// dtype) and accumulate (f32, bf16).
//
// cast is picked by its input dtype, so each kernel switches on the target.
// The conversions mixed precision runs every step (f32 <-> bf16, f32 <-> f16)
// have vectorized paths: bf16 is bit arithmetic the compiler vectorizes, f16
// uses the F16C instructions where the build has them. Every other pair goes
// through load_as_double/store_from_double, element by element: slow but it
// is the reference conversion itself, so results agree exactly.
// fill converts its value once and replicates the element's bytes.
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "brisk/core/op.h"
#include "cpu_util.h"
#include "kernels.h"

namespace brisk::cpu {
namespace {

using core::DType;
using core::KernelCall;

constexpr int64_t kCopyGrain = 1 << 18;  // bytes

// ---- cast ------------------------------------------------------------------------
void cast_generic(const KernelCall& c) {
  const core::TensorView &x = c.in(0), &y = c.out(0);
  if (x.dtype() == y.dtype()) {
    std::memcpy(y.data, x.data, x.meta.bytes());
    return;
  }
  parallel_for(x.numel(), kParallelGrain / 4, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      core::store_from_double(y.data, y.dtype(), size_t(i), core::load_as_double(x.data, x.dtype(), size_t(i)));
  });
}

void f32_to_bf16_range(const float* x, uint16_t* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = core::f32_to_bf16(x[i]);
}

void f32_to_f16_range(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), h);
  }
#endif
  for (; i < n; ++i) y[i] = core::f32_to_f16(x[i]);
}

void f16_to_f32_range(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
#endif
  for (; i < n; ++i) y[i] = core::f16_to_f32(x[i]);
}

// Runs fn(x + lo, y + lo, hi - lo) over the tensor in parallel chunks.
template <class From, class To, class Fn>
void cast_rows(const KernelCall& c, Fn fn) {
  const From* x = c.in(0).as<From>();
  To* y = c.out(0).as<To>();
  parallel_for(c.in(0).numel(), kParallelGrain, [&](int64_t lo, int64_t hi) { fn(x + lo, y + lo, hi - lo); });
}

void cast_from_f32(const KernelCall& c) {
  switch (c.p<core::CastParams>().to) {
    case DType::bf16: return cast_rows<float, uint16_t>(c, f32_to_bf16_range);
    case DType::f16: return cast_rows<float, uint16_t>(c, f32_to_f16_range);
    default: return cast_generic(c);
  }
}

void cast_from_bf16(const KernelCall& c) {
  if (c.p<core::CastParams>().to == DType::f32) return cast_rows<uint16_t, float>(c, bf16_to_f32_row);
  cast_generic(c);
}

void cast_from_f16(const KernelCall& c) {
  if (c.p<core::CastParams>().to == DType::f32) return cast_rows<uint16_t, float>(c, f16_to_f32_range);
  cast_generic(c);
}

// cast_many: each tensor through cast's kernel for its dtype.
void cast_many_any(const KernelCall& c) {
  for (size_t t = 0; t < c.inputs.size(); ++t) {
    KernelCall one = c;
    one.inputs = c.inputs.subspan(t, 1);
    one.outputs = c.outputs.subspan(t, 1);
    switch (c.in(int(t)).dtype()) {
      case DType::f32: cast_from_f32(one); break;
      case DType::bf16: cast_from_bf16(one); break;
      case DType::f16: cast_from_f16(one); break;
      default: cast_generic(one); break;
    }
  }
}

// ---- fill, copy --------------------------------------------------------------------
template <class E>
void fill_typed(void* data, int64_t n, const void* element) {
  E v;
  std::memcpy(&v, element, sizeof(E));
  E* y = static_cast<E*>(data);
  parallel_for(n, kParallelGrain * 4, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) y[i] = v;
  });
}

void fill_any(const KernelCall& c) {
  const core::TensorView& y = c.out(0);
  uint64_t element = 0;  // the value converted once, as the dtype's bytes
  core::store_from_double(&element, y.dtype(), 0, c.p<core::FillParams>().value);
  switch (core::dtype_size(y.dtype())) {
    case 1: return fill_typed<uint8_t>(y.data, y.numel(), &element);
    case 2: return fill_typed<uint16_t>(y.data, y.numel(), &element);
    case 4: return fill_typed<uint32_t>(y.data, y.numel(), &element);
    default: return fill_typed<uint64_t>(y.data, y.numel(), &element);
  }
}

void copy_any(const KernelCall& c) {
  if (c.out(0).data == c.in(0).data) return;
  const char* x = c.in(0).as<const char>();
  char* y = c.out(0).as<char>();
  parallel_for(int64_t(c.in(0).meta.bytes()), kCopyGrain, [&](int64_t lo, int64_t hi) {
    std::memcpy(y + lo, x + lo, size_t(hi - lo));
  });
}

// ---- accumulate: dst += src, output aliasing dst ----------------------------------------
void accumulate_f32(const KernelCall& c) {
  const float* a = c.in(0).as<float>();
  const float* b = c.in(1).as<float>();
  float* y = c.out(0).as<float>();
  parallel_for(c.in(0).numel(), kParallelGrain, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) y[i] = a[i] + b[i];
  });
}

void accumulate_bf16(const KernelCall& c) {
  const uint16_t* a = c.in(0).as<uint16_t>();
  const uint16_t* b = c.in(1).as<uint16_t>();
  uint16_t* y = c.out(0).as<uint16_t>();
  parallel_for(c.in(0).numel(), kParallelGrain, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) y[i] = core::f32_to_bf16(core::bf16_to_f32(a[i]) + core::bf16_to_f32(b[i]));
  });
}

}  // namespace

void register_memory_kernels(core::KernelRegistry& r) {
  using core::OpKind;
  for (int t = 0; t < core::kNumDTypes; ++t) {
    const auto dt = DType(t);
    r.add(OpKind::cast, dt,
          dt == DType::f32    ? cast_from_f32
          : dt == DType::bf16 ? cast_from_bf16
          : dt == DType::f16  ? cast_from_f16
                              : cast_generic);
    r.add(OpKind::fill, dt, fill_any);
    r.add(OpKind::copy, dt, copy_any);
  }
  for (DType t : {DType::f32, DType::bf16, DType::f16}) r.add(OpKind::cast_many, t, cast_many_any);
  r.add(OpKind::accumulate, DType::f32, accumulate_f32);
  r.add(OpKind::accumulate, DType::bf16, accumulate_bf16);
}

}  // namespace brisk::cpu
