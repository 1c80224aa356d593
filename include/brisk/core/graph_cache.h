// Compiled programs (graph + plan + executor) cached by input shapes: the
// first step at a shape builds and plans, every later step at that shape
// reuses the result. This is the general form of "causal mask caching".
#pragma once

#include <algorithm>
#include <initializer_list>
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

  // The program for these input shapes; build() makes it on the first
  // call. A hit allocates nothing (the shapes are compared in place, no key
  // is made), so a model may look its program up every step.
  template <class Build>
  Program& get(std::initializer_list<Shape> shapes, Build&& build) {
    auto it = cache_.find(shapes);
    if (it != cache_.end()) { ++hits_; return *it->second; }
    ++misses_;
    return *cache_.emplace(key_of(shapes), build()).first->second;
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
  // Orders keys as std::vector's operator< does, and compares a key with
  // shapes without copying them into one.
  struct Less {
    using is_transparent = void;
    static int compare(const Key& a, std::initializer_list<Shape> b) {
      auto ib = b.begin();
      for (const auto& dims : a) {
        if (ib == b.end()) return 1;
        if (std::lexicographical_compare(dims.begin(), dims.end(), ib->begin(), ib->end())) return -1;
        if (std::lexicographical_compare(ib->begin(), ib->end(), dims.begin(), dims.end())) return 1;
        ++ib;
      }
      return ib == b.end() ? 0 : -1;
    }
    bool operator()(const Key& a, const Key& b) const { return a < b; }
    bool operator()(const Key& a, std::initializer_list<Shape> b) const { return compare(a, b) < 0; }
    bool operator()(std::initializer_list<Shape> a, const Key& b) const { return compare(b, a) > 0; }
  };
  std::map<Key, std::unique_ptr<Program>, Less> cache_;
  size_t hits_ = 0, misses_ = 0;
};

}  // namespace brisk::core
