// The sequence autoencoder through the built CLI, as a user runs it: `brisk
// data fasta2lmdb`, `brisk train` on a [model] kind = "autoencoder" config,
// `brisk encode` (feature cache hits on a repeated sequence, a warning for a
// sequence over max_len) and `brisk decode` (FASTA back, one record per
// latent, of the encoded lengths), and the errors: an unknown residue names
// file, line and column; an autoencoder checkpoint handed to generate or
// classify, and a GPT handed to encode or decode, name both kinds.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "../common/tiny_gpt.h"
#include "brisk/train/latents_file.h"
#include "integration_util.h"

namespace brisk::itest {
namespace {

// Two families of short "proteins" with a few changed residues.
std::string family_fasta(int records) {
  const std::string alphabet = "ACDEFGHIKLMNPQRSTVWY";
  const std::string fam[2] = {"MKTAYIAKQRQISFVKSHFSRQ", "GSHMLEDPVDAFQLATEEIK"};
  std::mt19937 rng(3);
  std::string text;
  for (int i = 0; i < records; ++i) {
    std::string s;
    for (char c : fam[i % 2]) s += rng() % 20 == 0 ? alphabet[rng() % 20] : c;
    text += ">p" + std::to_string(i) + "\n" + s + "\n";
  }
  return text;
}

struct FastaRecord {
  std::string name, residues;
};
std::vector<FastaRecord> read_fasta(const std::string& text) {
  std::vector<FastaRecord> out;
  size_t p = 0;
  while (p < text.size()) {
    size_t nl = text.find('\n', p);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = text.substr(p, nl - p);
    p = nl + 1;
    if (line.empty()) continue;
    if (line[0] == '>') out.push_back({line.substr(1), ""});
    else if (!out.empty()) out.back().residues += line;
  }
  return out;
}

class AutoencoderCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    write_text(dir_->file("train.fa"), family_fasta(60));
    CliResult r = run_cli({"data", "fasta2lmdb", "--no-progress", "--input", dir_->file("train.fa"), "--out",
                           dir_->file("train.lmdb")});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    write_text(dir_->file("ae.toml"),
               "[model]\nkind = \"autoencoder\"\nn_layer = 1\nn_embd = 32\nn_head = 2\nmax_len = 24\nlatent = 8\n\n"
               "[data]\nstore = \"" + dir_->file("train.lmdb") + "\"\n\n"
               "[train]\nbatch = 8\nepochs = 2\nlr = 3e-3\nwarmup = 2\nthreads = 2\nloader_workers = 1\n\n"
               "[checkpoint]\ndir = \"" + dir_->file("run") + "\"\n");
    r = run_cli({"train", "--config", dir_->file("ae.toml")});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    train_log_ = new std::string(r.out + r.err);
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete train_log_;
  }
  static TempDir* dir_;
  static std::string* train_log_;
};
TempDir* AutoencoderCli::dir_ = nullptr;
std::string* AutoencoderCli::train_log_ = nullptr;

TEST_F(AutoencoderCli, TrainReportsReconstructionNextToTheTrivialPredictor) {
  EXPECT_NE(train_log_->find("reconstruction, teacher-forced"), std::string::npos) << *train_log_;
  EXPECT_NE(train_log_->find("reconstruction, free-running greedy"), std::string::npos);
  EXPECT_NE(train_log_->find("trivial predictor"), std::string::npos);
  const auto report = nlohmann::json::parse(read_text(dir_->file("run/report.json")));
  EXPECT_TRUE(report["test"].contains("free_running_accuracy"));
  EXPECT_TRUE(report["test"].contains("trivial_accuracy"));
}

// The record cache's hit rate covers the batches the run trained on: its
// lookups are those batches' rows, never the rows of batches the workers
// prefetched past the last step (28 more hits in this 1-epoch run with 2
// workers, before). Assembled on the training thread (0 workers) a 1-epoch
// run has no hit at all; with workers one assembling the next epoch's first
// batch may decode a record before this epoch's last batch is assembled, so
// a few of that batch's lookups may be hits. The fixture's 2-epoch run (1
// worker: batches in order) finds every record epoch 1 decoded.
TEST_F(AutoencoderCli, CacheHitRateCountsTheBatchesTrainedOn) {
  const auto cache_of = [](const std::string& run) {
    return nlohmann::json::parse(read_text(run + "/report.json"))["training"]["cache"];
  };
  constexpr int64_t kRowsPerEpoch = 32;  // 4 steps of batch 8 (the last partial batch dropped)
  const auto two_epochs = cache_of(dir_->file("run"));
  const int64_t hits = two_epochs["hits"], misses = two_epochs["misses"];
  EXPECT_EQ(hits + misses, 2 * kRowsPerEpoch) << two_epochs;
  EXPECT_DOUBLE_EQ(two_epochs["hit_rate"].get<double>(), double(hits) / double(hits + misses));
  // Epoch 2 misses only the records of epoch 1's dropped partial batch (fewer than 8).
  EXPECT_GT(hits, kRowsPerEpoch - 8) << two_epochs;
  for (const char* workers : {"0", "2"}) {
    const std::string run = dir_->file(std::string("one_epoch_") + workers);
    const CliResult r = run_cli({"train", "--config", dir_->file("ae.toml"), "--set", "train.epochs=1", "--set",
                                 std::string("train.loader_workers=") + workers, "--set", "checkpoint.dir=" + run});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    const auto one_epoch = cache_of(run);
    const int64_t h = one_epoch["hits"], m = one_epoch["misses"];
    EXPECT_EQ(h + m, kRowsPerEpoch) << workers << " workers: " << one_epoch;
    if (std::string(workers) == "0") {
      EXPECT_EQ(h, 0) << one_epoch;
      EXPECT_NE((r.out + r.err).find("cache hit 0.0% (0 hits, 32 misses)"), std::string::npos) << r.out << r.err;
    } else {
      EXPECT_LE(h, 8) << "at most the last batch's rows: " << one_epoch;
    }
  }
}

TEST_F(AutoencoderCli, EncodeThenDecodeRoundTripsWithCacheHitsAndTruncation) {
  const std::string long_seq(30, 'A');  // over max_len 24
  write_text(dir_->file("in.fa"), ">first protein\nMKTAYIAKQRQISFVKSHFSRQ\n>second\nGSHMLEDPVDAFQLATEEIK\n"
                                  ">again\nMKTAYIAKQRQ\nISFVKSHFSRQ\n>long one\n" + long_seq + "\n");
  const std::string z = dir_->file("z.safetensors"), rec = dir_->file("rec.fa");
  CliResult r = run_cli({"encode", "--checkpoint", dir_->file("run"), "--input", dir_->file("in.fa"), "--out", z});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("wrote " + z + ": 4 latents of 8 numbers"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("feature cache hit rate 25.0% (1 of 4"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("1 sequence(s) longer than the model's max_len 24 were cut"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'long one' (30 residues)"), std::string::npos) << r.err;
  // Both files in one call: the second file's sequences were all seen in the first.
  r = run_cli({"encode", "--checkpoint", dir_->file("run"), "--input", dir_->file("in.fa") + "," + dir_->file("in.fa"),
               "--out", dir_->file("z2.safetensors")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("feature cache: 4 of 4 reused (100.0%)"), std::string::npos) << r.err;

  r = run_cli({"decode", "--checkpoint", dir_->file("run"), "--latents", z, "--out", rec});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto records = read_fasta(read_text(rec));
  ASSERT_EQ(records.size(), 4u);
  const std::vector<std::string> names = {"first protein", "second", "again", "long one"};
  const std::vector<size_t> lengths = {22, 20, 22, 24};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(records[i].name, names[i]);
    EXPECT_EQ(records[i].residues.size(), lengths[i]) << names[i];
    EXPECT_EQ(records[i].residues.find_first_not_of("ACDEFGHIKLMNPQRSTVWYBZXUO*-"), std::string::npos);
  }
  EXPECT_EQ(records[0].residues, records[2].residues) << "the same sequence, the same latent, the same decoding";
  // Without --out the FASTA goes to stdout.
  r = run_cli({"decode", "--checkpoint", dir_->file("run"), "--latents", z});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_fasta(r.out).size(), 4u);
}

TEST_F(AutoencoderCli, AnUnknownResidueIsNamedWithFileLineAndColumn) {
  write_text(dir_->file("bad.fa"), ">ok\nMKTAY\n>bad\nMKJAY\n");
  const CliResult r = run_cli({"encode", "--checkpoint", dir_->file("run"), "--input", dir_->file("bad.fa"), "--out",
                               dir_->file("bad.safetensors")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(dir_->file("bad.fa") + ":4:3: invalid residue 'J'"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_->file("bad.safetensors")));
}

TEST_F(AutoencoderCli, CheckpointsOfAnotherKindAreRefusedByName) {
  const std::string gpt = brisk::testing::save_tiny_gpt(dir_->file("gpt"));
  CliResult r = run_cli({"encode", "--checkpoint", gpt, "--input", dir_->file("train.fa"), "--out",
                         dir_->file("x.safetensors")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("this checkpoint is a GPT language model (for brisk generate, eval, serve), but a sequence "
                       "autoencoder (for brisk encode, decode) is needed here"),
            std::string::npos)
      << r.err;
  r = run_cli({"decode", "--checkpoint", gpt, "--latents", dir_->file("z.safetensors")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("this checkpoint is a GPT language model"), std::string::npos) << r.err;

  r = run_cli({"generate", "--checkpoint", dir_->file("run"), "--prompt", "MKT", "--max-new", "2"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("this checkpoint is a sequence autoencoder (for brisk encode, decode), but a GPT"),
            std::string::npos)
      << r.err;
  write_text(dir_->file("msg.txt"), "hello");
  r = run_cli({"classify", "--checkpoint", dir_->file("run"), dir_->file("msg.txt")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("this checkpoint is a sequence autoencoder (for brisk encode, decode), but an encoder"),
            std::string::npos)
      << r.err;
}

// What the audit of encode and decode found, each refused by name: outputs
// that overwrote their input or the checkpoint's weights, latents decoded by
// another model (noise, exit 0), names that split a FASTA header, a failed
// write to stdout that exited 0. A header that is not UTF-8 is kept with
// U+FFFD (it was an internal error after the whole encoding).
TEST_F(AutoencoderCli, OutputsOverInputsOtherModelsAndBadNamesAreRefused) {
  const std::string fa = dir_->file("keep.fa"), z = dir_->file("keep.safetensors");
  write_text(fa, ">caf\xe9 latin-1\nMKTAYIAKQRQISFVKSHFSRQ\n>second\nGSHMLEDPVDAFQLATEEIK\n");
  const std::string fasta_before = read_text(fa);
  std::string weights;
  for (const auto& e : fs::directory_iterator(dir_->file("run")))
    if (e.path().filename().string().rfind("step_", 0) == 0) weights = (e.path() / "model.safetensors").string();
  ASSERT_FALSE(weights.empty());
  const std::string weights_before = read_text(weights);
  // fasta2lmdb replaced its input FASTA with the store the same way.
  const CliResult store = run_cli({"data", "fasta2lmdb", "--no-progress", "--input", fa, "--out", fa});
  EXPECT_EQ(store.exit_code, 2) << store.err;
  for (const std::string& out : {fa, weights}) {
    const CliResult r = run_cli({"encode", "--checkpoint", dir_->file("run"), "--input", fa, "--out", out});
    EXPECT_EQ(r.exit_code, 2) << out << "\n" << r.err;
  }
  EXPECT_EQ(read_text(fa), fasta_before);
  EXPECT_EQ(read_text(weights), weights_before);

  CliResult r = run_cli({"encode", "--checkpoint", dir_->file("run"), "--input", fa, "--out", z});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("1 header(s) are not valid UTF-8 (first: " + fa + ", record 1)"), std::string::npos) << r.err;
  r = run_cli({"decode", "--checkpoint", dir_->file("run"), "--latents", z, "--out", z});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  r = run_cli({"decode", "--checkpoint", dir_->file("run"), "--latents", z});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_fasta(r.out).at(0).name, "caf\xef\xbf\xbd latin-1");
  // Stdout on a full disk.
  r = run_program("/bin/sh", {"-c", std::string(cli_path()) + " decode --checkpoint " + dir_->file("run") + " --latents " + z +
                                        " > /dev/full"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("stdout failed"), std::string::npos) << r.err;

  // Another model: the same shape (refused by its weights' digest) and a
  // longer max_len (refused by max_len).
  for (const std::string set : {"train.seed=99", "model.max_len=32"}) {
    const std::string other = dir_->file("other_" + std::to_string(set.size()));
    r = run_cli({"train", "--config", dir_->file("ae.toml"), "--set", "train.epochs=1", "--set", set, "--set",
                 "checkpoint.dir=\"" + other + "\""});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = run_cli({"decode", "--checkpoint", other, "--latents", z});
    EXPECT_EQ(r.exit_code, 2) << set << "\n" << r.err;
    EXPECT_NE(r.err.find("decode them with the checkpoint that encoded them"), std::string::npos) << r.err;
  }

  // A name with a line break would write a second, fake FASTA record.
  train::LatentsFile f;
  f.latent = 8;
  f.max_len = 24;
  f.latents.assign(8, 0.5f);
  f.lengths = {5};
  f.full_lengths = {5};
  f.names = {"a\n>fake\nWWWW"};
  train::write_latents_file(dir_->file("newline.safetensors"), f);
  r = run_cli({"decode", "--checkpoint", dir_->file("run"), "--latents", dir_->file("newline.safetensors")});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.err.find("line break"), std::string::npos) << r.err;

  // Configs: a vocabulary that is not the residues', an empty run directory.
  r = run_cli({"train", "--config", dir_->file("ae.toml"), "--set", "model.vocab_size=64"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("model.vocab_size must be 28"), std::string::npos) << r.err;
  r = run_cli({"train", "--config", dir_->file("ae.toml"), "--set", "checkpoint.dir=\"\""});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("checkpoint.dir must not be empty"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace brisk::itest
