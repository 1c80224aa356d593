// The inference engine: GPT-2 decoding with a key/value cache, many
// sequences at once.
//
// Keys and values live in a pool of fixed-size blocks (KvPool) allocated
// when the engine is made, so its memory is known before the first request.
// A sequence is admitted with the blocks it can ever need (prompt plus
// max_tokens, up to the context), so an admitted sequence never waits for
// memory; when the pool is short, add() refuses and the caller queues.
//
// step() runs one forward over the pending tokens of every active sequence:
// one token for each decoding sequence, then prompt tokens of prefilling
// sequences (in chunks, up to max_step_tokens rows) — decode and prefill
// share the pass, through kv_attention's (sequence, position) rows. Logits
// are computed only for rows that sample (each sequence's last pending
// token), and sequences join (add) and leave (finish, cancel) between steps:
// exactly what continuous batching needs.
//
// Every op runs through the backend's kernel registry (core::run_op): fp32
// Linears through `linear_packed` (repacked once when the engine is made),
// quantized ones through `linear_q8_packed` / `linear_q4_packed` where the
// CPU has avx512_vnni (also repacked) and `linear_q8` / `linear_q4`
// elsewhere,
// attention through `kv_attention`. CPU only for now.
//
// Context length: a prompt must leave room for at least one new token; a
// sequence that reaches the model's context ends with finish reason
// "length" (no context shift, documented in docs/inference.md).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "brisk/core/backend.h"
#include "brisk/core/dtype.h"
#include "brisk/infer/model.h"
#include "brisk/infer/sampler.h"

namespace brisk::data {
class Tokenizer;
}

namespace brisk::infer {

struct EngineOptions {
  int max_seqs = 16;              // sequences decoding at once
  int64_t max_step_tokens = 512;  // rows of one forward (prefill chunks)
  int64_t kv_mb = 0;              // key/value pool; 0: enough for max_seqs full contexts
  int64_t kv_block = 16;          // positions per block
  // Element type of the key/value pool: f32, or bf16 (half the memory, so
  // twice the positions in the same --kv-mb, and half the bytes a decoding
  // step reads; each key and value rounded once, to nearest even).
  core::DType kv_dtype = core::DType::f32;
  int threads = 0;                // CPU threads of whichever thread calls step() or score(); 0: one per core
  // Share the key/value blocks of prompt prefixes seen before (engine.cpp,
  // KvPool): a prompt that starts like an earlier one skips computing them.
  bool prefix_cache = true;
};

enum class Finish { none, length, stop, cancelled };
const char* finish_name(Finish f);  // "", "length", "stop", "cancelled"

struct TokenEvent {
  int64_t seq = 0;
  TokenChoice choice;
  Finish finish = Finish::none;
  bool context_full = false;  // finish == length because the context is full, not max_tokens
  std::string stop_matched;   // the stop string that ended it
  // finish == stop because this token closed the JSON object
  // (SamplingParams::json_object) or ended the grammar's text where nothing
  // may follow (SamplingParams::grammar): unlike a stop token, it is text.
  bool constraint_closed = false;
  // A stop token (SamplingParams::stop_tokens) ended it: no part of the text.
  bool ended_by_stop_token() const { return finish == Finish::stop && stop_matched.empty() && !constraint_closed; }
  int64_t cached_prompt_tokens = 0;  // on a sequence's first event: its prompt positions taken from the prefix cache
  // On a sequence's first event, with SamplingParams::prompt_logprobs >= 0:
  // one choice per prompt token after the first (token = that prompt token).
  std::vector<TokenChoice> prompt_logprobs;
};

// Called with the rows a Linear reads (what AWQ calibration needs).
// which: 0 = attention qkv input, 1 = attention output (proj input),
// 2 = MLP input (fc), 3 = MLP hidden (fc_proj input).
using ActivationObserver = std::function<void(int64_t layer, int which, const float* rows, int64_t n, int64_t width)>;

struct EngineStats {
  int64_t prefill_tokens = 0, decode_tokens = 0, steps = 0;
  int64_t cached_prompt_tokens = 0;  // prompt positions taken from the prefix cache (not in prefill_tokens)
  double prefill_seconds = 0, decode_seconds = 0;  // steps with / without prompt rows
};

struct ScoreResult {
  double nll_sum = 0;            // summed over the scored positions (nats)
  int64_t count = 0;             // positions scored: ids.size() - 1
  std::vector<int32_t> argmax;   // the model's top token at each scored position
};

class Engine {
 public:
  // `tokenizer` (optional) lets stop strings match the decoded text, and
  // keeps draws to its tokens where the model's vocabulary is padded past
  // them (the padded ids have logits but no text).
  Engine(Model model, const EngineOptions& options, const data::Tokenizer* tokenizer = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Model& model() const;
  const EngineOptions& options() const;

  // Validates and admits a sequence; returns its id. Throws ConfigError for
  // bad parameters, a token outside the vocabulary or a prompt that leaves no
  // room in the context. Returns -1 when there is no free slot or not enough
  // cache blocks right now (try again after some sequences finish).
  int64_t add(const std::vector<int32_t>& prompt, const SamplingParams& params);
  void cancel(int64_t id);  // ends it at the next step with Finish::cancelled
  // One forward over every active sequence; the tokens it produced.
  std::vector<TokenEvent> step();
  bool idle() const;           // no active sequence
  int active() const;
  int64_t kv_bytes() const;    // the pool, allocated up front
  int64_t kv_blocks_free() const;    // free, or cached and held by no sequence
  int64_t kv_blocks_cached() const;  // holding a registered prompt prefix
  const EngineStats& stats() const;
  void reset_stats();

  // Teacher-forced scoring of one window (perplexity, quantization quality):
  // the negative log-likelihood of ids[1..] given what precedes each, and the
  // most likely token at every position. Uses the same kernels as decoding.
  // The engine must be idle.
  ScoreResult score(const std::vector<int32_t>& ids);
  void set_observer(ActivationObserver obs);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace brisk::infer
