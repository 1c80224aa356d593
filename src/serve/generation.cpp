// One request's sequences through the scheduler; see brisk/serve/generation.h.
#include "brisk/serve/generation.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <numeric>
#include <optional>
#include <utility>

#include "brisk/serve/scheduler.h"

namespace brisk::serve {

using nlohmann::json;

namespace {

// Why a choice ended without its finishing event, as an API error.
ApiError channel_error(const Channel& ch) {
  const int status = ch.error_status();
  return status == 400 ? ApiError(400, ch.error()) : ApiError(status, ch.error(), "", "server_error");
}

}  // namespace

// Events of every choice, in the order they arrived; `closed` marks the
// end of a choice's channel.
struct Generation::Inbox {
  struct Item {
    size_t choice;
    std::vector<infer::TokenEvent> events;
    bool closed;
  };
  std::mutex m;
  std::condition_variable cv;
  std::deque<Item> items;

  void put(Item item) {
    {
      std::lock_guard lk(m);
      items.push_back(std::move(item));
    }
    cv.notify_one();
  }
  std::deque<Item> take() {
    std::unique_lock lk(m);
    cv.wait(lk, [&] { return !items.empty(); });
    return std::exchange(items, {});
  }
};

Generation::Generation(Scheduler& scheduler, const data::Tokenizer& tok, const Request& req, const std::string& id,
                       int64_t created, const std::string& model, ResponseCache* cache)
    : scheduler_(scheduler),
      include_usage_(req.include_usage),
      prompt_tokens_(req.prompt_tokens),
      best_of_(req.best_of),
      n_(req.n) {
  builders_.reserve(req.choices.size());
  std::optional<ChoiceEvents> cached;
  if (cache && cache->enabled()) {
    cache_key_ = ResponseCache::key_of(req, model);
    if (!cache_key_.empty()) cached = cache->get(cache_key_);
    // A request without a key (sampled without a seed) is never looked up,
    // so its events are not recorded either.
    if (!cached && !cache_key_.empty()) cache_ = cache, recorded_.resize(req.choices.size());
  }
  from_cache_ = cached.has_value();
  for (size_t i = 0; i < req.choices.size(); ++i) {
    const CompletionRequest& c = req.choices[i];
    std::shared_ptr<Channel> ch = cached ? Channel::replay((*cached)[i]) : scheduler_.submit(c.prompt, c.params);
    if (!ch) {
      for (const auto& submitted : channels_) scheduler_.cancel(submitted);
      throw ApiError(429, "the server is busy: its queue of waiting requests is full; retry later", "",
                     "rate_limit_exceeded", "rate_limit_exceeded");
    }
    channels_.push_back(std::move(ch));
    builders_.emplace_back(tok, c, id, created, model, req.api, int64_t(i));
    // Sequences of one prompt are contiguous, best_of of them: the first of
    // each counts the prompt's cached tokens (comparing prompts took a
    // prompt repeated in the list for one prompt).
    first_of_prompt_.push_back(i % size_t(std::max<int64_t>(1, req.best_of)) == 0);
  }
  if (!req.stream) return;
  inbox_ = std::make_shared<Inbox>();
  for (size_t i = 0; i < channels_.size(); ++i)
    readers_.emplace_back([ch = channels_[i], inbox = inbox_, i] {
      std::vector<infer::TokenEvent> events;
      while (ch->next(events)) inbox->put({i, std::move(events), false});
      inbox->put({i, {}, true});
    });
}

Generation::~Generation() {
  cancel();
  // A reader ends when its channel closes: at once for a finished choice,
  // at the scheduler's next step for a cancelled one.
  for (std::thread& t : readers_) t.join();
}

// Reads only channels_, which no one changes after the constructor; the
// scheduler's cancel is thread-safe and does nothing to a finished channel.
void Generation::cancel() {
  for (const auto& ch : channels_) scheduler_.cancel(ch);
}

void Generation::record(size_t choice, const std::vector<infer::TokenEvent>& events) {
  if (cache_) recorded_[choice].insert(recorded_[choice].end(), events.begin(), events.end());
}

// Every choice finished (none failed or was cancelled): the events are the
// whole answer, worth keeping.
void Generation::store_if_complete() {
  if (!cache_) return;
  for (const CompletionBuilder& b : builders_)
    if (!b.finished()) return;
  cache_->put(cache_key_, std::move(recorded_));
  cache_ = nullptr;
}

json Generation::usage() const {
  int64_t completion = 0, cached = 0;
  for (size_t i = 0; i < builders_.size(); ++i) {
    completion += builders_[i].completion_tokens();
    if (first_of_prompt_[i]) cached += builders_[i].cached_tokens();
  }
  return {{"prompt_tokens", prompt_tokens_},
          {"completion_tokens", completion},
          {"total_tokens", prompt_tokens_ + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

json Generation::response() {
  std::vector<infer::TokenEvent> events;
  for (size_t i = 0; i < channels_.size(); ++i) {
    while (channels_[i]->next(events)) {
      record(i, events);
      for (const infer::TokenEvent& e : events) builders_[i].add(e);
    }
    if (!builders_[i].finished()) throw channel_error(*channels_[i]);
  }
  store_if_complete();
  json r = builders_.front().envelope(false);
  r["choices"] = json::array();
  if (best_of_ == n_) {
    for (const CompletionBuilder& b : builders_) r["choices"].push_back(b.choice());
  } else {
    std::vector<size_t> order(static_cast<size_t>(best_of_));
    for (size_t p = 0; p * size_t(best_of_) < builders_.size(); ++p) {
      const size_t first = p * size_t(best_of_);
      std::iota(order.begin(), order.end(), first);
      // Ties keep the sequences' order, so the same request gets the same answer.
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return builders_[a].mean_logprob() > builders_[b].mean_logprob();
      });
      for (int64_t i = 0; i < n_; ++i)
        r["choices"].push_back(builders_[order[size_t(i)]].choice(int64_t(p) * n_ + i));
    }
  }
  r["usage"] = usage();
  return r;
}

bool Generation::pump(const std::function<bool(const std::string&)>& write) {
  if (done_) return true;
  // With include_usage every chunk before the usage chunk carries
  // "usage": null, as OpenAI's streams do.
  const auto send = [&](json c) {
    if (include_usage_) c["usage"] = nullptr;
    return write(dump(c));
  };
  if (!started_) {
    started_ = true;
    for (const CompletionBuilder& b : builders_)
      if (const json c = b.first_chunk(); !c.is_null() && !send(c)) return false;
  }
  // Ends the stream with an error: the other choices are dropped.
  const auto end_with = [&](const ApiError& err) {
    done_ = true;
    error_status_ = err.status;
    cancel();
    return write(dump(error_json(err))) && write("[DONE]");
  };
  for (Inbox::Item& item : inbox_->take()) {
    CompletionBuilder& b = builders_[item.choice];
    record(item.choice, item.events);
    try {
      for (const infer::TokenEvent& e : item.events)
        if (const json c = b.add(e); !c.is_null() && !send(c)) return false;
    } catch (const std::exception& ex) {
      // The text could not be built (the server's fault, not the request's).
      // This runs on an HTTP thread inside httplib's content provider, where
      // an escaping exception ends the process.
      return end_with(ApiError(500, std::string("cannot build the text: ") + ex.what(), "", "server_error"));
    }
    if (item.closed && !b.finished()) return end_with(channel_error(*channels_[item.choice]));  // one choice failed
  }
  for (const CompletionBuilder& b : builders_)
    if (!b.finished()) return true;
  done_ = true;
  store_if_complete();
  if (include_usage_) {
    json u = builders_.front().envelope(true);
    u["choices"] = json::array();
    u["usage"] = usage();
    if (!write(dump(u))) return false;
  }
  return write("[DONE]");
}

}  // namespace brisk::serve
