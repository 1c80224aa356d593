// The reference backend: every op's scalar reference kernel, for every dtype.
#include "brisk/ops/reference_backend.h"

#include <cstring>

#include "brisk/ops/ops.h"

namespace brisk::ops {

ReferenceBackend::ReferenceBackend() {
  register_ops();
  for (int op = 0; op < core::kNumOps; ++op) {
    const core::OpDef& d = core::op_def(core::OpKind(op));
    for (int t = 0; t < core::kNumDTypes; ++t) kernels().add(d.kind, core::DType(t), d.reference);
  }
}

void ReferenceBackend::copy_to_device(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void ReferenceBackend::copy_to_host(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

}  // namespace brisk::ops
