// Shared weight initialisation (init.h).
#include "brisk/models/init.h"

#include <cmath>
#include <string>

namespace brisk::models {

void init_transformer_weights(core::ParameterStore& params, uint64_t seed, int64_t n_layer) {
  const float residual_std = 0.02f / std::sqrt(2.0f * float(n_layer));
  uint64_t k = 0;
  for (auto& [name, e] : params.entries()) {
    ++k;
    const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    const bool is_ln = name.find(".ln_") != std::string::npos || name.rfind("ln_f", 0) == 0;
    const bool is_residual = name.find("c_proj.weight") != std::string::npos;
    core::Tensor init;
    if (is_bias || is_ln) {
      init = core::Tensor::empty(e.value.shape(), e.value.dtype());
      init.fill(is_bias ? 0.0 : 1.0);
    } else {
      init = core::Tensor::randn(e.value.shape(), e.value.dtype(), seed * 1000003ull + k, 0.f,
                                 is_residual ? residual_std : 0.02f);
    }
    params.upload(e.value, init);
  }
}

}  // namespace brisk::models
