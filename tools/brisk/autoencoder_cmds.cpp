// `brisk encode --checkpoint C --input X.fa [--input Y.fa] --out latents.safetensors`
// reads FASTA (the same parser as `brisk data fasta2lmdb`, so the same
// residues and the same errors with file, line and column) and writes one
// latent per sequence (latents_file.h). Inputs go through one feature cache
// (train::LatentCache), keyed by a digest of each sequence's residues, in
// order: a sequence repeated within a file or across the files of one call is
// encoded once; the hit rate is printed per file and in total. Sequences
// longer than the model's max_len are cut to their first max_len residues
// (the model never saw more) with a warning naming how many and the first.
//
// `brisk decode --checkpoint C --latents L [--out recon.fa]` greedy-decodes
// each latent to the length stored next to it and writes FASTA (stdout
// without --out; the file is written to a temporary name and renamed).
//
// Both refuse a checkpoint of another kind (a GPT, a classifier) by name.
#include "autoencoder_cmds.h"

#include <xxhash.h>

#include <algorithm>
#include <filesystem>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "brisk/core/atomic_file.h"
#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/data/converters.h"
#include "brisk/data/tokenizer.h"
#include "brisk/models/seq_autoencoder.h"
#include "brisk/train/autoencoder_trainer.h"
#include "brisk/train/checkpoint.h"
#include "brisk/train/latents_file.h"
#include "cli_checks.h"

namespace brisk::cli {

namespace {

struct Args {
  std::string checkpoint, out, latents, on_invalid = "error";
  std::vector<std::string> inputs;
  int threads = 0;
  int64_t cache_mb = 64;
};

struct Loaded {
  std::string dir;
  train::AutoencoderCheckpoint info;
  std::unique_ptr<cpu::CpuBackend> backend;
  std::unique_ptr<models::SeqAutoencoder> model;
};

// XXH64 of the checkpoint's weights as 16 hex digits: encode records it in
// the latents file, decode compares it (another model's latents decode to
// noise without any error: 29.6% identity against 95.4% from their own).
std::string model_digest(const std::string& dir) {
  const std::string bytes = core::read_file((std::filesystem::path(dir) / "model.safetensors").string());
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH64(bytes.data(), bytes.size(), 0));
  return hex;
}

Loaded load(const std::string& checkpoint, int threads) {
  Loaded m;
  m.dir = train::require_checkpoint(checkpoint);
  m.info = train::read_autoencoder_checkpoint(m.dir);  // names the kind when it is another model's
  m.backend = std::make_unique<cpu::CpuBackend>(threads);
  m.model = std::make_unique<models::SeqAutoencoder>(m.info.config, *m.backend);
  train::load_autoencoder_checkpoint(m.dir, *m.model);
  return m;
}

int run_encode(const Args& a) {
  if (a.cache_mb <= 0 || a.cache_mb > (int64_t{1} << 24))
    throw core::ConfigError("--cache-mb must be in [1, 2^24], got " + std::to_string(a.cache_mb));
  core::check_output_not_input(a.out, a.checkpoint);
  for (const std::string& in : a.inputs) core::check_output_not_input(a.out, in);
  Loaded m = load(a.checkpoint, a.threads);
  const int64_t L = m.info.config.max_len, Z = m.info.config.latent;
  train::LatentCache cache(*m.model, size_t(a.cache_mb) << 20);
  train::LatentsFile out;
  out.latent = Z;
  out.max_len = L;
  out.checkpoint = m.dir;
  out.model_xxh64 = model_digest(m.dir);
  int64_t truncated = 0, not_utf8 = 0;
  std::string first_truncated, first_not_utf8;
  const data::OnInvalid on_invalid = a.on_invalid == "skip" ? data::OnInvalid::Skip : data::OnInvalid::Error;
  for (const std::string& path : a.inputs) {
    const std::string text = core::read_file(path);
    std::vector<std::vector<int32_t>> sequences;
    const data::FastaSummary s = data::parse_fasta(text, path, on_invalid, [&](const data::FastaRecord& r) {
      sequences.push_back(*r.tokens);
      out.names.emplace_back(r.header);
      if (data::first_invalid_utf8(r.header) >= 0 && not_utf8++ == 0)
        first_not_utf8 = path + ", record " + std::to_string(sequences.size());
    });
    if (sequences.empty()) {
      const int64_t skipped = s.skipped_invalid + s.skipped_empty;
      // Under --on-invalid skip a file of bad records is skipped as a whole,
      // not the end of a run over many files.
      if (on_invalid == data::OnInvalid::Skip && skipped > 0) {
        std::fprintf(stderr, "%s: 0 sequences, %lld skipped as invalid or empty\n", path.c_str(), (long long)skipped);
        continue;
      }
      throw core::IoError(path + ": no FASTA records to encode");
    }
    for (size_t i = 0; i < sequences.size(); ++i) {
      const int64_t n = int64_t(sequences[i].size());
      out.full_lengths.push_back(int32_t(std::min<int64_t>(n, INT32_MAX)));
      out.lengths.push_back(int32_t(std::min(n, L)));
      if (n > L && truncated++ == 0)
        first_truncated = "'" + out.names[out.names.size() - sequences.size() + i].substr(0, 60) + "' (" +
                          std::to_string(n) + " residues)";
    }
    const uint64_t hits0 = cache.hits(), lookups0 = cache.lookups();
    const std::vector<float> z = cache.encode(sequences);
    out.latents.insert(out.latents.end(), z.begin(), z.end());
    std::fprintf(stderr, "%s: %zu sequences%s | feature cache: %llu of %llu reused (%.1f%%)\n", path.c_str(),
                 sequences.size(),
                 s.skipped_invalid + s.skipped_empty
                     ? (", " + std::to_string(s.skipped_invalid + s.skipped_empty) + " skipped").c_str()
                     : "",
                 (unsigned long long)(cache.hits() - hits0), (unsigned long long)(cache.lookups() - lookups0),
                 100.0 * double(cache.hits() - hits0) / double(std::max<uint64_t>(1, cache.lookups() - lookups0)));
  }
  if (out.names.empty())
    throw core::IoError("no FASTA records to encode: every record of the inputs was skipped as invalid or empty");
  if (truncated)
    std::fprintf(stderr,
                 "brisk encode: warning: %lld sequence(s) longer than the model's max_len %lld were cut to their "
                 "first %lld residues (first: %s); decode rebuilds only those\n",
                 (long long)truncated, (long long)L, (long long)L, first_truncated.c_str());
  if (not_utf8)
    std::fprintf(stderr,
                 "brisk encode: warning: %lld header(s) are not valid UTF-8 (first: %s); the latents file keeps "
                 "names as JSON text, so their invalid bytes are stored as U+FFFD\n",
                 (long long)not_utf8, first_not_utf8.c_str());
  train::write_latents_file(a.out, out);
  std::printf("wrote %s: %lld latents of %lld numbers | feature cache hit rate %.1f%% (%llu of %llu sequences "
              "reused)\n",
              a.out.c_str(), (long long)out.size(), (long long)Z, 100.0 * cache.hit_rate(),
              (unsigned long long)cache.hits(), (unsigned long long)cache.lookups());
  return 0;
}

int run_decode(const Args& a) {
  if (!a.out.empty()) {
    core::check_output_not_input(a.out, a.latents);
    core::check_output_not_input(a.out, a.checkpoint);
  }
  Loaded m = load(a.checkpoint, a.threads);
  const train::LatentsFile f = train::read_latents_file(a.latents);
  const int64_t L = m.info.config.max_len, Z = m.info.config.latent;
  if (f.latent != Z)
    throw core::IoError(a.latents + ": latents have " + std::to_string(f.latent) + " numbers, but the checkpoint " +
                        m.dir + " has model.latent " + std::to_string(Z));
  // Another model's latents decode to noise without any error: refuse them.
  const std::string from = f.checkpoint.empty() ? std::string("another checkpoint") : f.checkpoint;
  if (f.max_len > 0 && f.max_len != L)
    throw core::IoError(a.latents + ": the latents were made by " + from + " (max_len " + std::to_string(f.max_len) +
                        "), not by " + m.dir + " (max_len " + std::to_string(L) +
                        "): decode them with the checkpoint that encoded them");
  if (!f.model_xxh64.empty())
    if (const std::string ours = model_digest(m.dir); ours != f.model_xxh64)
      throw core::IoError(a.latents + ": the latents were made by " + from + " (weights " + f.model_xxh64 +
                          "), not by the weights of " + m.dir + " (" + ours +
                          "): decode them with the checkpoint that encoded them");
  for (int64_t i = 0; i < f.size(); ++i)
    if (f.lengths[size_t(i)] > L)
      throw core::IoError(a.latents + ": lengths[" + std::to_string(i) + "] is " +
                          std::to_string(f.lengths[size_t(i)]) + ", above the checkpoint's max_len " +
                          std::to_string(L));
  // Batches of similar lengths: a batch decodes as many steps as its longest row.
  std::vector<size_t> order(size_t(f.size()));
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return f.lengths[x] < f.lengths[y]; });
  std::vector<std::string> residues(order.size());
  constexpr size_t kBatch = 32;
  std::vector<float> z;
  std::vector<int32_t> lens;
  for (size_t b0 = 0; b0 < order.size(); b0 += kBatch) {
    const size_t rows = std::min(kBatch, order.size() - b0);
    z.clear();
    lens.clear();
    for (size_t r = 0; r < rows; ++r) {
      const size_t i = order[b0 + r];
      z.insert(z.end(), f.latents.begin() + int64_t(i) * Z, f.latents.begin() + int64_t(i + 1) * Z);
      lens.push_back(f.lengths[i]);
    }
    const std::vector<int32_t> tokens = m.model->decode(z.data(), lens.data(), int64_t(rows));
    const size_t W = tokens.size() / rows;
    for (size_t r = 0; r < rows; ++r) {
      std::string& s = residues[order[b0 + r]];
      for (int32_t t = 0; t < lens[r]; ++t) s += data::fasta_residue(tokens[r * W + size_t(t)]);
    }
  }
  std::string fasta;
  for (size_t i = 0; i < residues.size(); ++i) {
    fasta += ">" + f.names[i] + "\n";
    for (size_t k = 0; k < residues[i].size(); k += 60) fasta += residues[i].substr(k, 60) + "\n";
  }
  if (a.out.empty()) {
    std::fwrite(fasta.data(), 1, fasta.size(), stdout);  // main() checks that stdout was written
  } else {
    core::write_file_atomic(a.out, fasta);
    std::printf("wrote %s: %zu sequences decoded greedily from %s\n", a.out.c_str(), residues.size(),
                a.latents.c_str());
  }
  return 0;
}

}  // namespace

AutoencoderCommands add_autoencoder_commands(CLI::App& parent) {
  auto args = std::make_shared<Args>();
  AutoencoderCommands c;
  c.encode = parent.add_subcommand("encode", "FASTA sequences -> latents (safetensors) with a sequence autoencoder");
  c.encode->add_option("--checkpoint", args->checkpoint, "Checkpoint or run directory")->required();
  c.encode->add_option("--input", args->inputs, "FASTA file(s), repeated or comma-separated")
      ->required()
      ->delimiter(',');
  c.encode->add_option("--out", args->out, "Output .safetensors file")->required()->check(output_file());
  c.encode->add_option("--on-invalid", args->on_invalid,
                       "error: stop at a bad residue; skip: drop the record (and its latent)")
      ->check(CLI::IsMember({"error", "skip"}))
      ->capture_default_str();
  c.encode->add_option("--cache-mb", args->cache_mb, "Feature cache budget (MiB)")->capture_default_str();
  c.encode->add_option("--threads", args->threads, "CPU threads (0 = all cores)")->check(non_negative());

  c.decode = parent.add_subcommand("decode", "Latents -> FASTA by greedy decoding with a sequence autoencoder");
  c.decode->add_option("--checkpoint", args->checkpoint, "Checkpoint or run directory")->required();
  c.decode->add_option("--latents", args->latents, "Latents file from brisk encode")->required();
  c.decode->add_option("--out", args->out, "Output FASTA file (default: stdout)")->check(output_file());
  c.decode->add_option("--threads", args->threads, "CPU threads (0 = all cores)")->check(non_negative());

  c.run = [args, e = c.encode]() { return *e ? run_encode(*args) : run_decode(*args); };
  return c;
}

}  // namespace brisk::cli
