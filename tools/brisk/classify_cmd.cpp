// `brisk classify`: each file is one message, read whole (or its body only,
// when the classifier was trained on a --strip-headers store: the checkpoint
// says) and tokenized with the checkpoint's tokenizer; a directory stands for every regular file under it, in path
// order. One line per message: label, its probability, the path. An empty
// message, an unreadable file or a checkpoint of another kind (a GPT) is an
// error naming it, before anything is classified.
#include "classify_cmd.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/data/tokenizer.h"
#include "brisk/models/encoder.h"
#include "brisk/train/checkpoint.h"
#include "brisk/train/classifier_trainer.h"
#include "cli_checks.h"

namespace brisk::cli {

namespace {

namespace fs = std::filesystem;

struct Args {
  std::string checkpoint;
  std::vector<std::string> inputs;
  int threads = 0;
  std::string precision = "fp32";
};

std::vector<fs::path> message_files(const std::vector<std::string>& inputs) {
  std::vector<fs::path> files;
  for (const std::string& in : inputs) {
    if (fs::is_directory(in)) {
      std::vector<fs::path> found;
      for (const auto& e : fs::recursive_directory_iterator(in))
        if (e.is_regular_file()) found.push_back(e.path());
      if (found.empty()) throw core::IoError(in + ": the directory holds no files to classify");
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(in)) {
      files.emplace_back(in);
    } else if (fs::exists(in)) {
      throw core::IoError(in + ": not a regular file or a directory (a message is read from a file)");
    } else {
      throw core::IoError(in + ": no such file or directory");
    }
  }
  return files;
}

int run(const Args& a) {
  const std::string dir = train::require_checkpoint(a.checkpoint);
  const train::EncoderCheckpoint info = train::read_encoder_checkpoint(dir);
  const std::unique_ptr<data::Tokenizer> tok = train::message_tokenizer(info, dir, "brisk classify");

  const std::vector<fs::path> files = message_files(a.inputs);
  std::vector<std::vector<int32_t>> sequences;
  for (const fs::path& f : files) {
    const std::string text = core::read_file(f.string());
    if (text.empty()) throw core::IoError(f.string() + ": empty message, nothing to classify");
    const std::string_view input = train::message_text(info, text);
    if (input.empty()) throw core::IoError(f.string() + ": the message has no body (the classifier reads bodies only)");
    sequences.push_back(tok->encode(input));
  }

  cpu::CpuBackend backend(a.threads);
  models::EncoderConfig config = info.config;
  config.compute = train::classifier_compute(a.precision, [](const std::string& line) {
    std::fprintf(stderr, "brisk classify: %s\n", line.c_str());
  });
  models::Encoder model(config, backend);
  train::load_encoder_checkpoint(dir, model);
  const std::vector<float> probs = train::predict_probs(model, sequences);
  const int64_t K = info.config.n_classes;
  for (size_t i = 0; i < files.size(); ++i) {
    const float* p = probs.data() + i * size_t(K);
    const int64_t k = std::max_element(p, p + K) - p;
    std::printf("%s\t%.4f\t%s\n", info.label_names[size_t(k)].c_str(), double(p[k]), files[i].c_str());
  }
  return 0;
}

}  // namespace

ClassifyCommand add_classify_command(CLI::App& parent) {
  auto args = std::make_shared<Args>();
  ClassifyCommand c;
  c.app = parent.add_subcommand("classify", "Label messages with an encoder classifier checkpoint");
  c.app->add_option("--checkpoint", args->checkpoint, "Checkpoint or run directory")->required();
  c.app->add_option("inputs", args->inputs, "Message files, or directories of them")->required();
  c.app->add_option("--threads", args->threads, "CPU threads (0 = all cores)")->check(non_negative());
  c.app->add_option("--precision", args->precision,
                    "fp32, or bf16: the blocks in bf16 where the CPU has bf16 dot products (fp32 with a warning "
                    "where it does not)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  c.run = [args] { return run(*args); };
  return c;
}

}  // namespace brisk::cli
