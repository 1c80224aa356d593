// Chrome trace of chosen training steps (step_trace.h). Events are "X"
// (complete) events, ts and dur in microseconds from the start of the first
// traced step, all on pid 0 / tid 1 (the trainer thread: kernels run on it,
// their OpenMP or GPU work inside them); nesting comes from containment:
// step > micro_step > kernels.
#include "step_trace.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "brisk/core/error.h"
#include "brisk/core/op.h"
#include "brisk/core/safetensors.h"

namespace brisk::train {

namespace {

using Json = nlohmann::json;

constexpr int kPid = 0, kTid = 1;

Json event(const std::string& name, const char* cat, double start_s, double end_s, double origin_s) {
  return {{"name", name}, {"cat", cat},   {"ph", "X"},
          {"ts", (start_s - origin_s) * 1e6}, {"dur", std::max(0.0, end_s - start_s) * 1e6},
          {"pid", kPid},  {"tid", kTid}};
}

Json shapes(const core::Graph& g, const std::vector<core::ValueId>& values) {
  Json out = Json::array();
  for (core::ValueId v : values) out.push_back(g.meta(v).str());
  return out;
}

}  // namespace

StepTrace::StepTrace(std::string path, std::vector<int64_t> steps) : path_(std::move(path)), steps_(std::move(steps)) {
  std::sort(steps_.begin(), steps_.end());
  steps_.erase(std::unique(steps_.begin(), steps_.end()), steps_.end());
  // A path that cannot be written fails now, not after the traced steps ran.
  if (std::filesystem::is_directory(path_))
    throw core::ConfigError("--trace: '" + path_ + "' is a directory; give a file name such as trace.json");
  const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
}

std::vector<int64_t> StepTrace::default_steps(int64_t start, int64_t total) {
  if (total <= start) return {};
  const int64_t first = std::min(start + 3, total), last = std::min(start + 5, total);
  std::vector<int64_t> out;
  for (int64_t s = first; s <= last; ++s) out.push_back(s);
  return out;
}

bool StepTrace::wants(int64_t step) const { return std::binary_search(steps_.begin(), steps_.end(), step); }

void StepTrace::begin(int64_t step, core::Executor& exec) {
  current_ = step;
  exec_ = &exec;
  kernels_.clear();
  spans_.clear();
  kernels_.reserve(exec.graph().nodes().size() * 4);  // no growth mid-step for a few micro-steps
  exec.set_trace(&kernels_);
}

void StepTrace::span(const char* name, const char* cat, double start_s, double end_s, int64_t micro) {
  if (current_ >= 0) spans_.push_back({name, cat, start_s, end_s, micro});
}

void StepTrace::end(double start_s, double end_s) {
  if (current_ < 0) return;
  exec_->set_trace(nullptr);
  if (origin_s_ < 0) origin_s_ = start_s;
  std::vector<Json> out;
  Json step = event("step", "step", start_s, end_s, origin_s_);
  step["args"] = {{"step", current_}};
  out.push_back(std::move(step));
  for (const Span& s : spans_) {
    Json e = event(s.name, s.cat, s.start_s, s.end_s, origin_s_);
    e["args"] = {{"step", current_}};
    if (s.micro >= 0) e["args"]["micro"] = s.micro;
    out.push_back(std::move(e));
  }
  const core::Graph& g = exec_->graph();
  for (const core::Executor::KernelSpan& k : kernels_) {
    const core::Node& node = g.nodes()[k.node];
    Json e = event(std::string(core::op_name(k.op)), node.is_backward ? "backward" : "forward", k.start_s, k.end_s,
                   origin_s_);
    e["args"] = {{"step", current_}, {"node", k.node}, {"inputs", shapes(g, node.inputs)},
                 {"outputs", shapes(g, node.outputs)}};
    if (!node.outputs.empty() && !g.value(node.outputs[0]).name.empty()) e["args"]["value"] = g.value(node.outputs[0]).name;
    // The micro-step whose forward and backward this kernel ran in.
    for (const Span& s : spans_)
      if (s.micro >= 0 && std::string_view(s.cat) == "micro_step" && k.start_s >= s.start_s && k.start_s <= s.end_s)
        e["args"]["micro"] = s.micro;
    out.push_back(std::move(e));
  }
  for (const Json& e : out) {
    if (!events_.empty()) events_ += ",\n";
    events_ += e.dump();
  }
  ++traced_;
  current_ = -1;
  exec_ = nullptr;
  kernels_.clear();
  spans_.clear();
  if (!steps_.empty() && traced_ == int64_t(steps_.size())) write();
}

bool StepTrace::write() {
  if (traced_ == 0 || written_) return false;
  const Json meta_process = {{"name", "process_name"}, {"ph", "M"}, {"pid", kPid}, {"args", {{"name", "brisk train"}}}};
  const Json meta_thread = {{"name", "thread_name"}, {"ph", "M"}, {"pid", kPid}, {"tid", kTid},
                            {"args", {{"name", "trainer"}}}};
  const Json other = {{"steps", steps_}, {"steps_traced", traced_},
                      {"note", "kernels ran one by one with a synchronize after each (as under --profile)"}};
  std::string text = "{\"displayTimeUnit\": \"ms\",\n\"otherData\": " + other.dump() + ",\n\"traceEvents\": [\n" +
                     meta_process.dump() + ",\n" + meta_thread.dump() + (events_.empty() ? "" : ",\n") + events_ +
                     "\n]}\n";
  core::write_file_atomic(path_, text);
  written_ = true;
  return true;
}

}  // namespace brisk::train
