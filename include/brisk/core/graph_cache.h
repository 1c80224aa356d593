// Compiled programs (graph + plan + executor) cached by input shapes: the
// first step at a shape builds and plans, every later step at that shape
// reuses the result. This is the general form of "causal mask caching".
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "brisk/core/shape.h"

namespace brisk::core {

template <class Program>
class ShapeCache {
 public:
  using Key = std::vector<std::vector<int64_t>>;
  static Key key_of(std::initializer_list<Shape> shapes) {
    Key k;
    for (const Shape& s : shapes) k.emplace_back(s.begin(), s.end());
    return k;
  }

  Program& get(const Key& key, const std::function<std::unique_ptr<Program>()>& build) {
    auto it = cache_.find(key);
    if (it != cache_.end()) { ++hits_; return *it->second; }
    ++misses_;
    return *cache_.emplace(key, build()).first->second;
  }
  size_t hits() const { return hits_; }
  size_t misses() const { return misses_; }
  size_t size() const { return cache_.size(); }
  // f(program) for every cached program, in key order.
  template <class F>
  void for_each(F f) const {
    for (const auto& [key, program] : cache_) f(*program);
  }
  void clear() { cache_.clear(); }

 private:
  std::map<Key, std::unique_ptr<Program>> cache_;
  size_t hits_ = 0, misses_ = 0;
};

}  // namespace brisk::core
