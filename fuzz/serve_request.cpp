// Fuzz target: the request parsers of `brisk serve` (src/serve/completions.cpp,
// chat.cpp, fields.cpp) on a tiny byte-tokenizer model (context 64, vocab
// 256). Input: a request body, read by the /v1/completions parser (single-
// and multi-choice) and the /v1/chat/completions parser, and by the encoder
// routes' parser (pooled_api.cpp) for a classifier and an embedder.
//
// A body is either refused with an ApiError (a 4xx status and a message) or
// becomes sequences the engine accepts as they are: prompt ids in the
// vocabulary, prompt + max_tokens within the context, sampling parameters
// that pass infer::validate, and no more choices than the server allows.
// An encoder request becomes non-empty sequences of ids in the vocabulary,
// each cut to max_len, with their token count.
// The same bytes as a request's path, method and client in the access log
// (--log-requests) make one line with no control byte in it: a client
// cannot forge or split log lines.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "brisk/core/error.h"
#include "brisk/data/tokenizer.h"
#include "brisk/serve/access_log.h"
#include "brisk/serve/completions.h"
#include "brisk/serve/pooled_api.h"
#include "fuzz_util.h"

namespace {

using namespace brisk;

const serve::ModelInfo kModel{"tiny", 256, 64, 8};

void check_sequence(const serve::CompletionRequest& c) {
  FUZZ_CHECK(!c.prompt.empty());
  for (int32_t id : c.prompt) FUZZ_CHECK(id >= 0 && id < kModel.vocab);
  FUZZ_CHECK(c.params.max_tokens >= (c.echo ? 0 : 1));  // 0 only to score an echoed prompt
  FUZZ_CHECK(c.params.prompt_logprobs < 0 || (c.echo && c.params.prompt_logprobs == c.params.logprobs));
  FUZZ_CHECK(int64_t(c.prompt.size()) + c.params.max_tokens <= kModel.context);
  infer::validate(c.params, kModel.vocab);  // a ConfigError escaping is a finding
}

void check_request(const serve::Request& r) {
  FUZZ_CHECK(!r.choices.empty() && int64_t(r.choices.size()) <= kModel.max_choices);
  FUZZ_CHECK(r.prompt_tokens >= 1);
  for (const serve::CompletionRequest& c : r.choices) {
    check_sequence(c);
    // Logprobs the client did not ask for are computed only to rank best_of's sequences.
    FUZZ_CHECK(!c.hide_logprobs || (r.best_of > r.n && c.params.logprobs == 0));
  }
  // best_of sequences per prompt, n of them answered; never streamed when they differ.
  FUZZ_CHECK(r.n >= 1 && r.best_of >= r.n && r.choices.size() % size_t(r.best_of) == 0);
  FUZZ_CHECK(r.best_of == r.n || !r.stream);
  if (r.api == serve::Api::chat) {
    FUZZ_CHECK(r.choices[0].params.stop.back() == serve::kChatStop);
    FUZZ_CHECK(r.prompt_tokens == int64_t(r.choices[0].prompt.size()));
  }
}

// An encoder model of max_len 16: texts are read as bytes, except '~',
// which the encoder refuses (as a FASTA reader refuses a non-residue).
serve::PooledModel pooled_model(serve::PooledModel::Kind kind) {
  serve::PooledModel m;
  m.kind = kind;
  m.width = 3;
  m.max_len = 16;
  m.vocab = 256;
  m.labels = {"a", "b", "c"};
  return m;
}

std::vector<int32_t> encode_bytes(const std::string& text, const std::string& param) {
  std::vector<int32_t> ids;
  for (unsigned char c : text) {
    if (c == '~') throw serve::ApiError(400, param + ": '~' is not read", param);
    ids.push_back(c);
  }
  return ids;
}

void check_pooled(const serve::PooledRequest& r, const serve::PooledModel& m) {
  FUZZ_CHECK(!r.sequences.empty());
  int64_t tokens = 0;
  for (const std::vector<int32_t>& s : r.sequences) {
    FUZZ_CHECK(!s.empty() && int64_t(s.size()) <= m.max_len);
    for (int32_t id : s) FUZZ_CHECK(id >= 0 && id < m.vocab);
    tokens += int64_t(s.size());
  }
  FUZZ_CHECK(r.tokens == tokens);
  FUZZ_CHECK(!r.base64 || m.kind == serve::PooledModel::Kind::embedder);
}

void check_refusal(const serve::ApiError& e) {
  FUZZ_CHECK(e.status >= 400 && e.status < 500);
  FUZZ_CHECK(std::string(e.what()).size() > 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<data::Tokenizer> tok = data::make_byte_tokenizer();
  const std::string body(fuzz::as_text(data, size));
  try {
    check_request(serve::parse_completions(body, kModel, *tok));
  } catch (const serve::ApiError& e) {
    check_refusal(e);
  }
  try {
    const serve::Request r = serve::parse_chat(body, kModel, *tok);
    FUZZ_CHECK(r.api == serve::Api::chat);
    check_request(r);
  } catch (const serve::ApiError& e) {
    check_refusal(e);
  }
  for (auto kind : {serve::PooledModel::Kind::classifier, serve::PooledModel::Kind::embedder}) {
    const serve::PooledModel m = pooled_model(kind);
    try {
      check_pooled(serve::parse_pooled(body, kModel, m, encode_bytes), m);
    } catch (const serve::ApiError& e) {
      check_refusal(e);
    }
  }
  serve::RequestNote note;
  note.start = std::chrono::steady_clock::time_point{} + std::chrono::seconds(1);
  note.stream = int(size % 2);
  const std::string line = serve::access_log_line(std::chrono::system_clock::time_point{}, body, body, body, 400,
                                                  note, note.start + std::chrono::milliseconds(5));
  FUZZ_CHECK(line.rfind("time=1970-01-01T00:00:00.000Z client=", 0) == 0);
  for (unsigned char c : line) FUZZ_CHECK(c >= 0x20 && c != 0x7f);
  return 0;
}
