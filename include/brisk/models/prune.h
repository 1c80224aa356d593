// Weight pruning of a GPT (docs/pruning.md): zeroing a share of the Linear
// weights of every block, unstructured by magnitude or in the 2:4 pattern
// that sparse matrix units accelerate, with a per-layer count of the zeros;
// and the mask that keeps pruned weights at zero while the model is
// fine-tuned.
//
// What is pruned: the four Linear weights of each block (attn.c_attn,
// attn.c_proj, mlp.c_fc, mlp.c_proj), which hold nearly all of a block's
// parameters and all of its matrix-product work. Left alone: the token
// embedding (it is also the LM head, so zeroing it would cut both the input
// and the output vocabulary), the position embedding, LayerNorms and biases
// (small, and each entry matters to every token).
//
// The mask is not stored: it is the set of pruned weights that are exactly
// 0. A weight that training left exactly 0.0 by chance is vanishingly rare,
// and holding it at zero costs nothing; deriving the mask from the weights
// means any checkpoint written while the mask was kept (a fine-tune, a
// resumed run) carries its mask with it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "brisk/core/param_store.h"
#include "brisk/models/gpt.h"

namespace brisk::models {

enum class PruneMethod { magnitude, two_four };
// Where magnitude pruning draws its line: in each matrix on its own (every
// layer ends at the sparsity asked for), or once over all of them together
// (torch.nn.utils.prune.global_unstructured: the smallest weights of the
// whole model go, so layers of small weights lose more than the others).
enum class PruneScope { layer, global };

// "magnitude" or "2:4"; anything else throws ConfigError listing both.
PruneMethod parse_prune_method(const std::string& name);
const char* prune_method_name(PruneMethod m);
// "layer" or "global"; anything else throws ConfigError listing both.
PruneScope parse_prune_scope(const std::string& name);
const char* prune_scope_name(PruneScope s);

// ConfigError for a sparsity outside [0, 1) (NaN included), a 2:4 sparsity
// other than 0.5, or 2:4 with the global scope (its groups are 4 weights of
// one row): what prune() checks first, for callers that want to refuse
// before loading a model.
void check_prune_options(PruneMethod method, double sparsity, PruneScope scope = PruneScope::layer);

// True for the parameters pruning touches: names ending in attn.c_attn.weight,
// attn.c_proj.weight, mlp.c_fc.weight or mlp.c_proj.weight.
bool is_prunable(const std::string& name);

struct LayerSparsity {
  std::string name;
  int64_t rows = 0, cols = 0;  // brisk's (out, in) layout; 2:4 groups run along cols
  int64_t zeros = 0;
  int64_t numel() const { return rows * cols; }
  double sparsity() const { return numel() ? double(zeros) / double(numel()) : 0.0; }
};

struct PruneReport {
  std::string method;       // "magnitude", "2:4", or "" for a plain count
  std::string scope;        // "layer" or "global" (magnitude), "" otherwise
  double requested = 0;     // the sparsity asked for
  std::vector<LayerSparsity> layers;  // prunable weights, in the store's (name) order
  int64_t model_params = 0;           // every parameter of the store, pruned or not
  int64_t zeros() const;
  int64_t numel() const;    // of the prunable weights
  double sparsity() const;  // zeros / numel of the prunable weights
};

// Prunes every prunable weight of the store in place and returns the count
// of zeros afterwards. magnitude: in each matrix, the round(sparsity x numel)
// entries of smallest |w| become 0 (ties go to the lower index), so each
// layer is within half an element of the target (zeros already there count as
// the smallest). 2:4: in each row, every group of 4 consecutive weights keeps
// its 2 largest |w| (ties to the lower index); sparsity must be 0.5, and the
// rows' length a multiple of 4. ConfigError for a sparsity outside [0, 1), a
// 2:4 sparsity other than 0.5, a row length 2:4 cannot split, or a store
// without any prunable weight. Works on a host or a device store.
// With PruneScope::global (magnitude only) the round(sparsity x numel) entries
// of smallest |w| over all prunable matrices together become 0, ties going to
// the earlier matrix (store order) and then the lower index; the total is
// exact and each layer ends where its weights fall.
PruneReport prune(core::ParameterStore& store, PruneMethod method, double sparsity,
                  PruneScope scope = PruneScope::layer);
inline PruneReport prune(Gpt& model, PruneMethod method, double sparsity, PruneScope scope = PruneScope::layer) {
  return prune(model.params(), method, sparsity, scope);
}

// The zeros in each prunable weight, changing nothing.
PruneReport sparsity_report(const core::ParameterStore& store);

// One matrix, on host memory: what prune() does to each weight. The magnitude
// form returns how many entries it zeroed (already-zero ones included).
int64_t prune_magnitude(float* w, int64_t n, double sparsity);
void prune_two_four(float* w, int64_t rows, int64_t cols);

// The pruned weights of a host store: the positions of every prunable weight
// that is exactly 0 when the mask is made. apply() zeroes them again in the
// weights and in every optimizer-state tensor of the same entry (AdamW's
// moments), so an update can neither move a pruned weight nor leave momentum
// that would move it later. The positions are found once; apply() allocates
// nothing.
class PruneMask {
 public:
  // Throws ConfigError for a store on a device: the positions are applied by
  // host code.
  static PruneMask from_zeros(const core::ParameterStore& store);

  void apply(core::ParameterStore& store) const;
  int64_t masked() const { return masked_; }     // weights held at zero
  int64_t prunable() const { return prunable_; }  // weights of the prunable matrices

 private:
  struct MaskedWeight {
    std::string name;
    std::vector<uint32_t> zeros;  // element offsets; a matrix has < 2^32 entries (checked)
  };
  std::vector<MaskedWeight> tensors_;
  int64_t masked_ = 0, prunable_ = 0;
};

}  // namespace brisk::models
