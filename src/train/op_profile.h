// `--profile`'s per-op breakdown of a train step: the table the trainers
// print and the JSON their reports keep. Internal to src/train.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "brisk/core/executor.h"

namespace brisk::train::detail {

// "op  calls  seconds  share" rows, largest share first; ops never called are left out.
std::string op_time_table(const core::Executor::OpTimes& times);
// {"<op>": {"calls", "seconds", "share"}} for the ops called.
nlohmann::json op_times_json(const core::Executor::OpTimes& times);

}  // namespace brisk::train::detail
