// `brisk prune`: loads a checkpoint, prunes the Linear weights of every block
// (models::prune, docs/pruning.md), and writes the result as an ordinary
// checkpoint directory that `generate`, `eval` and `train.init_from` read.
//
// The output is built as a checkpoint (train::save_checkpoint) under a
// hidden staging directory next to it, completed there (state.json gains a
// `pruning` record, prune_report.json is added) and renamed into place in
// one step, so an interrupted prune never leaves a half-written directory
// under the name asked for. An existing non-empty --out is refused rather
// than replaced: it could be a run directory.
#include "prune_cmd.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "brisk/core/atomic_file.h"
#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/models/gpt.h"
#include "brisk/models/prune.h"
#include "cli_checks.h"
#include "brisk/train/checkpoint.h"

namespace brisk::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct PruneArgs {
  std::string checkpoint, method, out, json_path, scope = "layer";
  double sparsity = 0.5;
  int threads = 0;
};

json report_json(const models::PruneReport& r, const std::string& source) {
  json layers = json::array();
  for (const models::LayerSparsity& l : r.layers)
    layers.push_back({{"name", l.name},
                      {"shape", {l.rows, l.cols}},
                      {"numel", l.numel()},
                      {"zeros", l.zeros},
                      {"sparsity", l.sparsity()}});
  return {{"format", "brisk prune report"},
          {"version", 1},
          {"source", source},
          {"method", r.method},
          {"scope", r.scope.empty() ? json(nullptr) : json(r.scope)},
          {"sparsity", r.requested},
          {"shape_layout", "out, in"},
          {"layers", layers},
          {"total", {{"numel", r.numel()}, {"zeros", r.zeros()}, {"sparsity", r.sparsity()}}},
          {"model", {{"params", r.model_params},
                     {"zeros", r.zeros()},
                     {"sparsity", r.model_params ? double(r.zeros()) / double(r.model_params) : 0.0}}}};
}

void print_table(const models::PruneReport& r, const std::string& source, const std::string& out) {
  std::printf("brisk prune: %s -> %s | method %s%s%s, sparsity %g\n\n", source.c_str(), out.c_str(),
              r.method.c_str(), r.scope.empty() ? "" : ", scope ", r.scope.c_str(), r.requested);
  std::printf("%-28s %16s %12s %12s %9s\n", "layer", "shape (out, in)", "weights", "zeros", "sparsity");
  for (const models::LayerSparsity& l : r.layers) {
    const std::string shape = "(" + std::to_string(l.rows) + ", " + std::to_string(l.cols) + ")";
    std::printf("%-28s %16s %12lld %12lld %8.2f%%\n", l.name.c_str(), shape.c_str(), (long long)l.numel(),
                (long long)l.zeros, 100.0 * l.sparsity());
  }
  std::printf("%-28s %16s %12lld %12lld %8.2f%%\n", "total (pruned layers)", "", (long long)r.numel(),
              (long long)r.zeros(), 100.0 * r.sparsity());
  std::printf("%-28s %16s %12lld %12lld %8.2f%%\n", "whole model", "", (long long)r.model_params, (long long)r.zeros(),
              r.model_params ? 100.0 * double(r.zeros()) / double(r.model_params) : 0.0);
  std::printf("\nnot pruned: token embedding (also the LM head), positions, LayerNorms, biases\n");
}

// --out as a directory path with a name (a trailing slash dropped), refused
// when something other than an empty directory is there.
fs::path output_dir(const std::string& out) {
  fs::path p = fs::absolute(out).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  if (fs::exists(p) && !(fs::is_directory(p) && fs::is_empty(p)))
    throw core::ConfigError("--out " + out + " already exists and is not an empty directory; remove it or choose "
                            "another path");
  return p;
}

int run_prune(const PruneArgs& a) {
  // Everything the command line decides is checked before any file is read.
  const models::PruneMethod method = models::parse_prune_method(a.method);
  const models::PruneScope scope = models::parse_prune_scope(a.scope);
  models::check_prune_options(method, a.sparsity, scope);
  const fs::path out = output_dir(a.out);
  if (!a.json_path.empty()) {
    const fs::path parent = fs::absolute(a.json_path).parent_path();
    if (!fs::is_directory(parent))
      throw core::ConfigError("--json " + a.json_path + ": directory " + parent.string() + " does not exist");
    core::check_output_not_input(a.json_path, a.checkpoint);
  }

  if (!fs::exists(a.checkpoint)) throw core::IoError(a.checkpoint + ": no such checkpoint or run directory");
  const std::string dir = train::latest_checkpoint(a.checkpoint);
  if (dir.empty())
    throw core::IoError(a.checkpoint + ": not a brisk checkpoint (expected a directory with state.json, or a run "
                        "directory with step_* checkpoints)");
  train::TrainState state;
  const models::GptConfig cfg = train::read_checkpoint_config(dir, &state);
  cpu::CpuBackend backend(a.threads);
  models::Gpt model(cfg, backend);
  train::load_checkpoint(dir, model, nullptr);

  const models::PruneReport report = models::prune(model, method, a.sparsity, scope);
  const json rj = report_json(report, dir);

  // Staged next to the output, so the final rename stays on one file system.
  fs::create_directories(out.parent_path());
  const fs::path staging = out.parent_path() / (".tmp_prune_" + out.filename().string());
  fs::remove_all(staging);
  state.loss_scaler.reset();  // no optimizer state goes with a pruned model
  const fs::path ckpt = train::save_checkpoint(staging.string(), model, nullptr, state, 0);
  // The method and sparsity go into state.json: readers ignore fields they do not know.
  const std::string state_path = (ckpt / "state.json").string();
  json st = json::parse(core::read_file(state_path));
  st["pruning"] = {{"method", report.method},    {"sparsity", report.requested}, {"source", dir},
                   {"zeros", report.zeros()},    {"weights", report.numel()}};
  if (!report.scope.empty()) st["pruning"]["scope"] = report.scope;
  core::write_file_atomic(state_path, st.dump(2) + "\n");
  core::write_file_atomic((ckpt / "prune_report.json").string(), rj.dump(2) + "\n");
  fs::rename(ckpt, out);  // replaces an empty directory of that name
  fs::remove_all(staging);

  if (!a.json_path.empty()) core::write_file_atomic(a.json_path, rj.dump(2) + "\n");
  print_table(report, dir, out.string());
  std::printf("wrote %s (report: %s/prune_report.json%s%s)\n", out.string().c_str(), out.string().c_str(),
              a.json_path.empty() ? "" : ", ", a.json_path.c_str());
  return 0;
}

}  // namespace

PruneCommand add_prune_command(CLI::App& parent) {
  auto* prune = parent.add_subcommand("prune", "Zero a share of a checkpoint's block weights (magnitude or 2:4)");
  auto args = std::make_shared<PruneArgs>();
  prune->add_option("--checkpoint", args->checkpoint, "Checkpoint directory, or a run directory (newest is used)")
      ->required();
  prune->add_option("--method", args->method, "magnitude (unstructured) | 2:4 (2 of every 4 along rows)")
      ->required();
  prune->add_option("--sparsity", args->sparsity,
                    "Share of the block weights to zero, in [0, 1): of each matrix (scope layer) or of all of them "
                    "(scope global); 2:4 needs 0.5")
      ->capture_default_str();
  prune->add_option("--scope", args->scope,
                    "Magnitude pruning's line: layer (each matrix on its own) | global (the smallest weights of all "
                    "block matrices together)")
      ->capture_default_str();
  prune->add_option("--out", args->out, "Output checkpoint directory (must not exist, or be empty)")->required();
  prune->add_option("--json", args->json_path, "Also write the per-layer report here (it is always in <out>)");
  prune->add_option("--threads", args->threads, "CPU threads (0 = all cores)")->check(non_negative());
  PruneCommand cmd;
  cmd.app = prune;
  cmd.run = [args]() { return run_prune(*args); };
  return cmd;
}

}  // namespace brisk::cli
