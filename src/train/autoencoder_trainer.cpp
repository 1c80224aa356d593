// The sequence autoencoder's training run and evaluation (autoencoder_trainer.h).
//
// The split is by distinct sequence: protein example files repeat one
// another (the same protease in three files under three names), and a
// sequence seen in training and then "held out" would make reconstruction
// look better than it is. Repeats are found by a digest of the residues and
// left out after their first record, like empty records; what remains is
// split with the classifier's seeded split (every label 0).
//
// Batches come as in the classifier run: the bucketing batcher pads each
// batch to its longest member, cut to max_len; the trainer rounds that width
// up to a multiple of kSeqMultiple so a run builds a handful of programs.
#include "brisk/train/autoencoder_trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/data/batching.h"
#include "brisk/data/converters.h"
#include "brisk/data/loader.h"
#include "brisk/data/record_cache.h"
#include "brisk/data/record_store.h"
#include "brisk/data/token_hash.h"
#include "brisk/monitor/machine.h"
#include "brisk/optim/optimizer.h"
#include "brisk/train/checkpoint.h"
#include "best_epoch.h"
#include "divergence.h"
#include "epoch_resume.h"
#include "epoch_steps.h"
#include "fresh_run.h"
#include "op_profile.h"
#include "resume_changes.h"

namespace brisk::train {

namespace fs = std::filesystem;
using core::ConfigError;

namespace {

using detail::round_width;

// Indices of `sequences` sorted by (cut) length, cut into batches of `batch`:
// neighbours share a width, so little is padded.
std::vector<std::vector<size_t>> length_batches(const std::vector<int64_t>& lengths, int64_t batch) {
  std::vector<size_t> order(lengths.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lengths[a] < lengths[b]; });
  std::vector<std::vector<size_t>> out;
  for (size_t b0 = 0; b0 < order.size(); b0 += size_t(batch))
    out.emplace_back(order.begin() + int64_t(b0), order.begin() + int64_t(std::min(order.size(), b0 + size_t(batch))));
  return out;
}

// Cut lengths; an empty sequence is an error naming it.
std::vector<int64_t> cut_lengths(const std::vector<std::vector<int32_t>>& sequences, int64_t max_len,
                                 const char* what) {
  std::vector<int64_t> n(sequences.size());
  for (size_t i = 0; i < sequences.size(); ++i) {
    if (sequences[i].empty())
      throw core::ShapeError("sequence " + std::to_string(i) + " is empty: nothing to " + what);
    n[i] = std::min<int64_t>(int64_t(sequences[i].size()), max_len);
  }
  return n;
}

// Lays rows `batch` of `sequences` out right-padded to width T.
void pad_rows(const std::vector<std::vector<int32_t>>& sequences, const std::vector<int64_t>& lengths,
              const std::vector<size_t>& batch, int64_t T, std::vector<int32_t>& ids, std::vector<int32_t>& lens) {
  ids.assign(batch.size() * size_t(T), 0);
  lens.assign(batch.size(), 0);
  for (size_t r = 0; r < batch.size(); ++r) {
    const size_t i = batch[r];
    std::copy_n(sequences[i].begin(), lengths[i], ids.begin() + int64_t(r) * T);
    lens[r] = int32_t(lengths[i]);
  }
}

}  // namespace

Reconstruction evaluate_reconstruction(models::SeqAutoencoder& model,
                                       const std::vector<std::vector<int32_t>>& sequences, int32_t trivial_token,
                                       bool free_running) {
  const int64_t L = model.config().max_len, V = model.config().vocab_size, Z = model.config().latent;
  const std::vector<int64_t> lengths = cut_lengths(sequences, L, "reconstruct");
  Reconstruction rec;
  rec.trivial_token = trivial_token;
  rec.sequences = int64_t(sequences.size());
  double loss = 0;
  int64_t tf_right = 0, fr_right = 0, trivial_right = 0, exact = 0;
  std::vector<int32_t> ids, lens;
  std::vector<float> latents;
  for (const std::vector<size_t>& batch : length_batches(lengths, kAutoencoderEvalBatch)) {
    const int64_t rows = int64_t(batch.size()), T = round_width(lengths[batch.back()], L);
    pad_rows(sequences, lengths, batch, T, ids, lens);
    // --- teacher forced: the decoder reads the true residues before each position
    const float* logits = model.logits(ids.data(), lens.data(), rows, T);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t t = 0; t < lens[size_t(r)]; ++t) {
        const float* z = logits + (r * T + t) * V;
        const int32_t target = ids[size_t(r * T + t)];
        const int64_t arg = std::max_element(z + 1, z + V) - z;  // token 0 is padding, never a residue
        const float mx = *std::max_element(z, z + V);
        double sum = 0;
        for (int64_t v = 0; v < V; ++v) sum += std::exp(double(z[v] - mx));
        loss += std::log(sum) + double(mx) - double(z[target]);
        tf_right += arg == target;
        trivial_right += target == trivial_token;
        ++rec.residues;
      }
    if (!free_running) continue;
    // --- free running: greedy decoding from the latent alone
    const float* z = model.encode(ids.data(), lens.data(), rows, T);
    latents.assign(z, z + rows * Z);
    const std::vector<int32_t> out = model.decode(latents.data(), lens.data(), rows);
    const int64_t W = int64_t(out.size()) / rows;
    for (int64_t r = 0; r < rows; ++r) {
      int64_t right = 0;
      for (int64_t t = 0; t < lens[size_t(r)]; ++t) right += out[size_t(r * W + t)] == ids[size_t(r * T + t)];
      fr_right += right;
      exact += right == lens[size_t(r)];
    }
  }
  const double n = double(std::max<int64_t>(1, rec.residues));
  rec.loss = loss / n;
  rec.teacher_forced = double(tf_right) / n;
  rec.trivial = double(trivial_right) / n;
  if (free_running) {
    rec.free_running = double(fr_right) / n;
    rec.exact = double(exact) / double(std::max<int64_t>(1, rec.sequences));
  }
  return rec;
}

// ---- the feature cache --------------------------------------------------------------

LatentCache::LatentCache(models::SeqAutoencoder& model, size_t budget_bytes) : model_(model), cache_(budget_bytes) {}

std::vector<float> LatentCache::encode(const std::vector<std::vector<int32_t>>& sequences) {
  const int64_t L = model_.config().max_len, Z = model_.config().latent;
  const std::vector<int64_t> lengths = cut_lengths(sequences, L, "encode");
  const size_t row_bytes = size_t(Z) * sizeof(float);
  std::vector<float> out(sequences.size() * size_t(Z));
  // First pass: cached latents are copied; the rest are gathered, each
  // distinct sequence once, and every later repeat points at its first.
  std::unordered_map<std::string, size_t> pending_of;  // digest -> slot in `pending`
  std::vector<size_t> pending;                         // sequences to encode
  std::vector<std::string> pending_keys;
  std::vector<int64_t> slot(sequences.size(), -1);     // -1: filled from the cache
  for (size_t i = 0; i < sequences.size(); ++i) {
    std::string key = data::token_digest(std::span<const int32_t>(sequences[i].data(), size_t(lengths[i])));
    ++lookups_;
    if (auto it = pending_of.find(key); it != pending_of.end()) {
      ++hits_;
      slot[i] = int64_t(it->second);
      continue;
    }
    if (const data::LruCache::Value v = cache_.get(key)) {
      ++hits_;
      std::memcpy(out.data() + i * size_t(Z), v->data(), row_bytes);
      continue;
    }
    slot[i] = int64_t(pending.size());
    pending_of.emplace(key, pending.size());
    pending.push_back(i);
    pending_keys.push_back(std::move(key));
  }
  // Second pass: encode the new ones, batched by length.
  std::vector<int64_t> pending_lengths;
  for (size_t i : pending) pending_lengths.push_back(lengths[i]);
  std::vector<float> fresh(pending.size() * size_t(Z));
  std::vector<int32_t> ids, lens;
  for (const std::vector<size_t>& batch : length_batches(pending_lengths, 64)) {
    std::vector<size_t> rows;
    for (size_t k : batch) rows.push_back(pending[k]);
    const int64_t T = round_width(lengths[rows.back()], L);
    pad_rows(sequences, lengths, rows, T, ids, lens);
    const float* z = model_.encode(ids.data(), lens.data(), int64_t(rows.size()), T);
    for (size_t r = 0; r < batch.size(); ++r) {
      std::memcpy(fresh.data() + batch[r] * size_t(Z), z + r * size_t(Z), row_bytes);
      const auto* bytes = reinterpret_cast<const uint8_t*>(z + r * size_t(Z));
      cache_.put(pending_keys[batch[r]], std::vector<uint8_t>(bytes, bytes + row_bytes));
    }
  }
  for (size_t i = 0; i < sequences.size(); ++i)
    if (slot[i] >= 0) std::memcpy(out.data() + i * size_t(Z), fresh.data() + size_t(slot[i]) * size_t(Z), row_bytes);
  return out;
}

// ---- the run ------------------------------------------------------------------------

namespace {

// Every record's length and split label, read once at start-up: 0 for the
// first record of each distinct sequence, -1 for empty records and repeats.
struct Corpus {
  std::vector<int64_t> lengths;
  std::vector<int32_t> split_labels;
  std::vector<std::string> digests;  // data::token_digest of each record's residues
  int64_t empty = 0, duplicates = 0;
};

Corpus scan(const data::RecordStore& store) {
  Corpus c;
  const int64_t n = store.size();
  c.lengths.resize(size_t(n));
  c.digests.resize(size_t(n));
  data::RecordReader reader(store);
  data::Record r;
  reader.seek(0);
  for (int64_t i = 0; i < n && reader.next(r); ++i) {
    c.lengths[size_t(i)] = int64_t(r.tokens.size());
    c.digests[size_t(i)] = data::token_digest(r.tokens);
  }
  c.split_labels = split_labels_of(std::vector<int32_t>(size_t(n), 0), c.lengths, c.digests, c.empty, c.duplicates);
  return c;
}

std::vector<std::vector<int32_t>> sequences_of(const data::RecordStore& store, const std::vector<int64_t>& indices) {
  std::vector<std::vector<int32_t>> out;
  out.reserve(indices.size());
  for (int64_t i : indices) out.push_back(store.get(i).tokens);
  return out;
}

nlohmann::json reconstruction_json(const Reconstruction& r) {
  nlohmann::json j = {{"sequences", r.sequences},
                      {"residues", r.residues},
                      {"loss", r.loss},
                      {"teacher_forced_accuracy", r.teacher_forced},
                      {"trivial_accuracy", r.trivial},
                      {"trivial_residue", std::string(1, data::fasta_residue(r.trivial_token))}};
  if (r.free_running >= 0) {
    j["free_running_accuracy"] = r.free_running;
    j["exact_sequences"] = r.exact;
  }
  return j;
}

}  // namespace

AutoencoderResult train_autoencoder(const AutoencoderConfig& cfg, const AutoencoderOptions& options) {
  const double t_start = monitor::now_seconds();
  auto say = [&](const std::string& s) {
    if (!options.quiet) std::fprintf(stderr, "%s", s.c_str());
  };
  char line[640];

  // --- data: the store, every record's length, the split by distinct sequence
  if (!fs::exists(cfg.store))
    throw ConfigError("data.store: '" + cfg.store +
                      "' does not exist; make it with `make protein`, or: brisk data fasta2lmdb --input "
                      "FILE.fa[,FILE.fa...] --out " + cfg.store + "   (docs/autoencoder.md lists the files)");
  data::RecordStore store(cfg.store);
  if (store.info().tokenizer != "fasta")
    throw ConfigError("data.store: '" + cfg.store + "' holds '" + store.info().tokenizer +
                      "' tokens; the autoencoder reads residue stores made by brisk data fasta2lmdb");
  if (store.info().vocab_size > cfg.model.vocab_size)
    throw ConfigError("data.store: '" + cfg.store + "' has token ids up to " +
                      std::to_string(store.info().vocab_size - 1) + " but model.vocab_size is " +
                      std::to_string(cfg.model.vocab_size));
  const Corpus corpus = scan(store);
  AutoencoderResult res;
  res.records = store.size();
  res.dropped_empty = corpus.empty;
  res.duplicates = corpus.duplicates;
  res.split = stratified_split(corpus.split_labels, cfg.train_frac, cfg.val_frac, cfg.split_seed);
  const Split& split = res.split;
  if (split.train.empty()) throw ConfigError("data.store: '" + cfg.store + "' has no non-empty records to train on");
  if (split.test.empty())
    throw ConfigError("data.store: '" + cfg.store + "' has too few distinct sequences (" +
                      std::to_string(split.train.size() + split.val.size()) +
                      ") to hold any out for the test split; lower data.train_frac / data.val_frac or add data");
  for (const auto* part : {&split.train, &split.val, &split.test})
    for (int64_t i : *part) res.truncated += corpus.lengths[size_t(i)] > cfg.model.max_len;

  // --- the batch pipeline: bucketed batches of train records, through the cache
  data::RecordCache cached(store, cfg.model.max_len, size_t(cfg.cache_mb) << 20);
  data::SequenceSource source;
  for (int64_t i : split.train) source.lengths.push_back(corpus.lengths[size_t(i)]);
  source.fetch = [&](int64_t i, int64_t n, int32_t* out) {
    bool hit = false;
    const auto v = cached.get(split.train[size_t(i)], &hit);
    const auto tokens = data::LruCache::tokens(v);
    std::copy_n(tokens.begin(), n, out);
    return hit;
  };
  data::BucketingOptions bo;
  bo.batch_size = cfg.batch;
  bo.max_len = cfg.model.max_len;
  bo.truncate = true;
  bo.bucket = cfg.bucket;
  bo.drop_last = int64_t(split.train.size()) > cfg.batch;
  bo.seed = cfg.seed;
  data::RecordBatchSource batches(source, bo);
  const int64_t per_epoch = int64_t(batches.batches_per_epoch());
  data::Loader loader(batches, {.workers = cfg.loader_workers});
  loader.start();

  // --- the trivial predictor: the train split's most frequent residue (of what the model sees)
  std::vector<int64_t> counts(size_t(cfg.model.vocab_size), 0);
  for (int64_t i : split.train) {  // read past the cache, so its hit rate stays the batches' own
    const data::Record r = store.get(i);
    for (size_t k = 0; k < std::min(r.tokens.size(), size_t(cfg.model.max_len)); ++k) ++counts[size_t(r.tokens[k])];
  }
  const int32_t trivial = int32_t(std::max_element(counts.begin() + 1, counts.end()) - counts.begin());

  // --- model and optimizer; the train steps' blocks compute in the effective precision (fp32 master weights either way)
  const PrecisionChoice precision = detail::epoch_precision(cfg, say);
  res.precision_path = precision.path;
  cpu::CpuBackend backend(cfg.threads);
  models::SeqAutoencoderConfig model_config = cfg.model;
  model_config.compute = compute_dtype(precision.effective);
  models::SeqAutoencoder model(model_config, backend);
  model.init_weights(cfg.seed);
  model.set_input_dropout(cfg.input_dropout, cfg.seed);
  model.set_train_profiling(options.profile);
  optim::AdamW adamw(cfg.adamw, model.params(), backend);
  optim::LrSchedule schedule = cfg.schedule;
  schedule.total_steps = cfg.epochs * per_epoch;
  res.epochs = cfg.epochs;

  // --- a resumed run: the newest checkpoint's weights, moments, dropout generator and place in the batch stream
  EpochRunState stream = detail::epoch_run_state(cfg, per_epoch, int64_t(split.train.size()),
                                                 detail::split_digest(corpus.digests, split.train, nullptr));
  int64_t step = 0;
  const std::string resume_from = options.resume ? latest_checkpoint(cfg.out_dir) : std::string();
  if (options.resume && resume_from.empty()) say("resume: no checkpoint in " + cfg.out_dir + ", starting fresh\n");
  detail::check_creatable_dir(cfg.out_dir, "checkpoint.dir");
  if (!options.resume) detail::refuse_earlier_checkpoints(cfg.out_dir);
  // train.keep_best and train.early_stop: a resumed run reads its best epoch so far back
  detail::KeepBest keep(cfg.keep_best, cfg.early_stop, cfg.out_dir, !resume_from.empty(), split.val.empty(),
                        std::to_string(split.train.size()) + " / 0 / " + std::to_string(split.test.size()) +
                            " sequences");
  if (keep.best().epoch > 0 && !read_autoencoder_checkpoint(keep.best().checkpoint).config.same_shape(cfg.model))
    throw ConfigError(keep.best().checkpoint +
                      " (the best epoch so far) is for an autoencoder of another shape than this run's");
  if (!resume_from.empty()) {
    const AutoencoderCheckpoint saved = read_autoencoder_checkpoint(resume_from);
    detail::check_resumable(resume_from, {saved.step, saved.seed, saved.run}, cfg.seed, stream, schedule.total_steps);
    load_autoencoder_checkpoint(resume_from, model, &adamw);
    model.set_input_dropout(cfg.input_dropout, saved.run->input_dropout_state);
    step = res.start_step = saved.step;
    if (const std::string changed = detail::changed_settings_line(cfg.out_dir, to_toml(cfg), to_toml(AutoencoderConfig{}));
        !changed.empty())
      say(changed + "\n");
    res.checkpoint = resume_from;  // the newest, until this run writes one
    loader.set_position(uint64_t(step));
  }

  const detail::RunDir run_dir(cfg.out_dir, to_toml(cfg), step);
  std::FILE* metrics = run_dir.metrics;

  std::snprintf(line, sizeof line,
                "brisk train (sequence autoencoder): %lld params | %lld + %lld layers, %lld embd, %lld heads, "
                "latent %lld, max_len %lld | %s | recompute %s | %d threads\n"
                "data: %s (%lld records: %lld repeats and %lld empty left out, %lld cut to max_len) | split %zu / "
                "%zu / %zu sequences (seed %llu) | batch %lld, %lld steps/epoch x %lld epochs | %s batches\n",
                (long long)cfg.model.num_params(), (long long)cfg.model.n_layer, (long long)cfg.model.n_layer,
                (long long)cfg.model.n_embd, (long long)cfg.model.n_head, (long long)cfg.model.latent,
                (long long)cfg.model.max_len, precision.path.c_str(), cfg.model.recompute.c_str(), backend.num_threads(),
                cfg.store.c_str(), (long long)store.size(), (long long)res.duplicates, (long long)res.dropped_empty, (long long)res.truncated, split.train.size(),
                split.val.size(), split.test.size(), (unsigned long long)cfg.split_seed, (long long)cfg.batch,
                (long long)per_epoch, (long long)cfg.epochs, cfg.bucket ? "length-bucketed" : "shuffled (unbucketed)");
  say(line);
  if (!resume_from.empty()) say(detail::resumed_line(resume_from, step, per_epoch, schedule.total_steps));
  say(keep.note());
  if (keep.on())
    say(keep.start_line(cfg.keep_best == "val_loss" ? "(lowest) val loss" : "(highest) val teacher-forced accuracy"));

  const std::vector<std::vector<int32_t>> val_seqs = sequences_of(store, split.val);
  double eval_seconds = 0;
  auto validate = [&] {
    const double t0 = monitor::now_seconds();
    res.val = evaluate_reconstruction(model, val_seqs, trivial, false);
    eval_seconds += monitor::now_seconds() - t0;
  };
  // What a checkpoint records of the run at this step (the dropout generator's state included).
  auto checkpoint_info = [&] {
    stream.input_dropout_state = model.input_dropout_state();
    return AutoencoderCheckpoint{cfg.model, store.info().tokenizer, step, cfg.seed, stream};
  };
  auto save = [&] {
    res.checkpoint = save_autoencoder_checkpoint(cfg.out_dir, model, &adamw, checkpoint_info(), cfg.keep_checkpoints);
  };
  // After an epoch's validation: its weights become the best if they beat
  // every earlier epoch's (weights only; the run resumes from its own
  // checkpoints, not from these).
  auto keep_if_best = [&](int64_t epoch) {
    keep.consider(cfg.keep_best == "val_loss" ? res.val.loss : res.val.teacher_forced, epoch, step,
                  [&](const std::string& dir) {
                    return save_autoencoder_checkpoint(dir, model, nullptr, checkpoint_info(), 0);
                  });
  };

  // --- the steps
  detail::StopSignalGuard signals;
  std::vector<int32_t> ids;
  detail::StepCounters count;
  detail::ConsumedCacheCounts consumed;
  bool validated = false;
  for (int64_t epoch = step / per_epoch; epoch < cfg.epochs && !res.interrupted; ++epoch) {
    if (std::string stop; step == epoch * per_epoch && keep.patience_out(epoch, &stop)) {
      say(stop);
      res.early_stopped = true;
      res.epochs = epoch;
      break;
    }
    while (step < (epoch + 1) * per_epoch) {
      const double t0 = monitor::now_seconds();
      const data::Batch& b = loader.next();
      const int64_t T = round_width(b.cols, cfg.model.max_len);
      const int64_t real = detail::pad_batch(b, T, ids);
      model.params().zero_grads();
      const double loss = model.train_micro_step(ids.data(), b.lengths, b.rows, T);
      const float lr = schedule.at(step);
      const optim::StepStats st = adamw.step(lr);
      keep.trained();
      const double dt = monitor::now_seconds() - t0;
      count.add(real, b.rows * T, dt);
      if (step == res.start_step) res.first_loss = loss;
      res.last_loss = loss;
      consumed.add(b);
      const double hit = consumed.hit_rate();
      detail::write_step_row(metrics, {step + 1, epoch, loss, double(lr), st.grad_norm, dt, real, b.rows, T, hit,
                                       loader.last_wait_seconds()});
      if (detail::diverged(loss, st.grad_norm))
        throw detail::diverged_error(step + 1, loss, st.grad_norm, lr,
                                     "the checkpoints in " + cfg.out_dir + " are from before it");
      ++step;
      if (step % cfg.log_every == 0 || step == schedule.total_steps) {
        say(detail::progress_line(step, schedule.total_steps, epoch + 1, loss, lr, hit, count,
                                  std::min<int64_t>(cfg.log_every, step - res.start_step), "res/s"));
        count.reset_window();
      }
      const detail::AfterStep next =
          detail::after_step(step, (epoch + 1) * per_epoch, cfg.checkpoint_every, metrics, save);
      res.interrupted = next == detail::AfterStep::stop;
      if (next != detail::AfterStep::next) break;  // an epoch's end is validated and saved below
    }
    if (res.interrupted) break;
    // --- end of an epoch: teacher-forced validation, a checkpoint
    if (!val_seqs.empty()) {
      validate();
      validated = true;
      std::fprintf(metrics, "{\"epoch\":%lld,\"step\":%lld,\"val\":%s}\n", (long long)epoch + 1, (long long)step,
                   reconstruction_json(res.val).dump().c_str());
      std::snprintf(line, sizeof line, "epoch %lld: val loss %.4f | teacher-forced accuracy %.4f (trivial %.4f)\n",
                    (long long)epoch + 1, res.val.loss, res.val.teacher_forced, res.val.trivial);
      say(line);
      keep_if_best(epoch);
    }
    std::fflush(metrics);
    save();
    res.interrupted = detail::stop_signal() != 0 && step < schedule.total_steps;
  }
  res.steps = step;
  if (res.interrupted) {
    say(detail::stopped_line(step, res.checkpoint));
    return res;
  }
  // train.keep_best: val (for the report) and the test split on the best
  // epoch's weights. A run resumed at its last step trained nothing here:
  // its validation figures come now.
  const bool load_best = keep.best().epoch > 0 && !keep.in_model();
  if (load_best) load_autoencoder_checkpoint(keep.best().checkpoint, model);
  if ((load_best || !validated) && !val_seqs.empty()) validate();
  if (keep.best().epoch > 0)
    res.best_epoch = keep.best().epoch, res.best_score = keep.best().score, res.best_checkpoint = keep.best().checkpoint;
  res.train_seconds = count.seconds;
  res.tokens_per_s = count.seconds > 0 ? count.real_tokens / count.seconds : 0;
  res.padded_tokens_per_s = count.seconds > 0 ? count.cells / count.seconds : 0;
  res.padding_waste = count.cells > 0 ? 1.0 - count.real_tokens / count.cells : 0;
  res.cache_hit_rate = consumed.hit_rate();
  if (res.steps == res.start_step && res.start_step > 0) detail::no_training_figures(res);

  // --- the test split: teacher-forced and free-running reconstruction
  const double t_test = monitor::now_seconds();
  res.test = evaluate_reconstruction(model, sequences_of(store, split.test), trivial, true);
  eval_seconds += monitor::now_seconds() - t_test;
  res.eval_seconds = eval_seconds;
  res.seconds = monitor::now_seconds() - t_start;

  const data::CacheStats cs = cached.stats();
  int64_t test_truncated = 0;
  for (int64_t i : split.test) test_truncated += corpus.lengths[size_t(i)] > cfg.model.max_len;
  nlohmann::json report = {
      {"store", cfg.store},
      {"records", res.records},
      {"repeats_left_out", res.duplicates},
      {"empty_records_left_out", res.dropped_empty},
      {"truncated_to_max_len", {{"all_parts", res.truncated}, {"test", test_truncated}}},
      {"split", {{"seed", cfg.split_seed}, {"by", "distinct sequence"}, {"train", split.train.size()},
                 {"val", split.val.size()}, {"test", split.test.size()}}},
      {"model", {{"params", cfg.model.num_params()}, {"n_layer", cfg.model.n_layer}, {"n_embd", cfg.model.n_embd},
                 {"n_head", cfg.model.n_head}, {"max_len", cfg.model.max_len}, {"latent", cfg.model.latent}}},
      {"test", reconstruction_json(res.test)},
      {"val", reconstruction_json(res.val)},
      {"trivial",
       {{"what", "the train split's most frequent residue, predicted at every position"},
        {"residue", std::string(1, data::fasta_residue(trivial))}}},
      {"training",
       {{"steps", res.steps}, {"epochs", res.epochs}, {"seconds", res.seconds},
        {"train_step_seconds", res.train_seconds}, {"eval_seconds", res.eval_seconds},
        {"first_loss", res.first_loss}, {"last_loss", res.last_loss}, {"input_dropout", cfg.input_dropout},
        {"tokens_per_s", res.tokens_per_s},
        {"padded_tokens_per_s", res.padded_tokens_per_s}, {"padding_waste", res.padding_waste},
        {"bucketed", cfg.bucket},
        {"precision", precision_name(precision.effective)}, {"precision_path", precision.path},
        {"recompute", cfg.model.recompute},
        {"cache", {{"hit_rate", consumed.hit_rate()}, {"hits", consumed.hits},
                   {"misses", consumed.lookups - consumed.hits},
                   {"evictions", cs.evictions}, {"bytes_used", cs.bytes_used}}}}},
      {"checkpoint", res.checkpoint},
      {"early_stopped", res.early_stopped}};
  if (res.best_epoch > 0) report["best"] = keep.report();
  if (options.profile) report["profile"] = detail::op_times_json(model.train_op_times());
  core::write_file_atomic((fs::path(cfg.out_dir) / "report.json").string(), report.dump(2) + "\n");

  std::ostringstream out;
  std::snprintf(line, sizeof line,
                "done: %lld steps in %.0fs (%.0fs of them evaluating) | %.0f res/s (%.0f with padding) | padding "
                "%.1f%% | cache hit %.1f%% (%llu hits, %llu misses)\n",
                (long long)res.steps, res.seconds, res.eval_seconds, res.tokens_per_s, res.padded_tokens_per_s,
                100 * res.padding_waste, 100 * consumed.hit_rate(), (unsigned long long)consumed.hits,
                (unsigned long long)(consumed.lookups - consumed.hits));
  if (std::isnan(res.tokens_per_s))
    std::snprintf(line, sizeof line, "done: %lld steps, none trained here (%s)\n", (long long)res.steps,
                  res.early_stopped ? "the run had stopped early" : "resumed at the last step");
  out << line;
  if (res.best_epoch > 0) out << keep.result_line();
  std::snprintf(line, sizeof line,
                "test split: %lld sequences, %lld residues (%lld cut to max_len %lld), split seed %llu\n"
                "  reconstruction, teacher-forced       %6.2f%% of residues (loss %.4f)\n"
                "  reconstruction, free-running greedy  %6.2f%% of residues (%.1f%% of sequences exact)\n"
                "  trivial predictor (always '%c')       %6.2f%%\n",
                (long long)res.test.sequences, (long long)res.test.residues, (long long)test_truncated,
                (long long)cfg.model.max_len, (unsigned long long)cfg.split_seed, 100 * res.test.teacher_forced,
                res.test.loss, 100 * res.test.free_running, 100 * res.test.exact, data::fasta_residue(trivial),
                100 * res.test.trivial);
  out << line << "report: " << (fs::path(cfg.out_dir) / "report.json").string()
      << " | checkpoint: " << res.checkpoint << "\n";
  if (options.profile)
    out << "\n== time per op (train steps, every batch width) ==\n" << detail::op_time_table(model.train_op_times());
  say(out.str());
  return res;
}

}  // namespace brisk::train
