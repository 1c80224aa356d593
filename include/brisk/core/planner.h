// The memory planner. It walks a graph once, before anything runs: the live
// range of every planned value, buffer reuse inside one arena, and therefore
// an exact figure for the arena and for the whole step's memory.
//
// Views and in-place ops share their input's buffer ("aliases"); a buffer
// lives from its producer to the last reader of any alias. Offsets are chosen
// greedily, largest buffer first, into the lowest gap that is free over the
// buffer's whole lifetime (the "greedy by size" strategy of TFLite's arena
// planner), which lands close to the lower bound of the largest live set.
#pragma once

#include <string>
#include <vector>

#include "brisk/core/graph.h"

namespace brisk::core {

// Memory of one training/eval step, in bytes. arena is what the executor
// allocates; the other lines are the externals bound to it.
struct MemoryReport {
  size_t params = 0;
  size_t grads = 0;
  size_t optimizer_state = 0;
  size_t arena = 0;          // activations + workspace, after reuse
  size_t activations = 0;    // peak bytes of live planned values (inputs included)
  size_t workspace = 0;      // peak scratch of any one node
  size_t live_lower_bound = 0;  // max over time of live bytes: no arena can be smaller
  size_t total() const { return params + grads + optimizer_state + arena; }
  std::string str() const;  // one readable table
};

struct PlannedBuffer {
  size_t offset = 0;
  size_t bytes = 0;
  int first = 0, last = 0;  // node indices, inclusive
};

struct MemoryPlan {
  // Per value: byte offset into the arena, or SIZE_MAX for externals (and for
  // aliases of externals). Aliases carry their root's offset.
  std::vector<size_t> offset;
  std::vector<ValueId> root;          // the value whose buffer a value uses
  std::vector<size_t> workspace_offset;  // per node, SIZE_MAX if none
  std::vector<size_t> workspace_size;
  std::vector<PlannedBuffer> buffers;
  MemoryReport report;
  bool is_external(ValueId v) const { return offset[size_t(v)] == SIZE_MAX; }
};

MemoryPlan plan_memory(const Graph& g);

}  // namespace brisk::core
