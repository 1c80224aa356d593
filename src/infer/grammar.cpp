// Compiling GBNF grammars and regular expressions into rules of character
// sets; see brisk/infer/grammar.h for the syntax and what is refused.
#include "brisk/infer/grammar.h"

#include <algorithm>
#include <limits>
#include <map>

#include "brisk/core/error.h"

namespace brisk::infer {

namespace {

using Range = std::pair<uint32_t, uint32_t>;
constexpr uint32_t kSurrogateFirst = 0xD800, kSurrogateLast = 0xDFFF;

// Sorted, merged, without surrogates (no UTF-8 text holds one).
CodePointSet normalized(std::vector<Range> r) {
  std::vector<Range> cut;
  for (auto [lo, hi] : r) {
    if (lo < kSurrogateFirst && hi >= kSurrogateFirst) cut.emplace_back(lo, kSurrogateFirst - 1);
    if (hi > kSurrogateLast && lo <= kSurrogateLast) cut.emplace_back(kSurrogateLast + 1, hi);
    if (hi < kSurrogateFirst || lo > kSurrogateLast) cut.emplace_back(lo, hi);
  }
  std::sort(cut.begin(), cut.end());
  CodePointSet s;
  for (auto [lo, hi] : cut) {
    if (!s.ranges.empty() && lo <= s.ranges.back().second + 1) s.ranges.back().second = std::max(s.ranges.back().second, hi);
    else s.ranges.emplace_back(lo, hi);
  }
  return s;
}

CodePointSet complement(const CodePointSet& s) {
  std::vector<Range> out;
  uint32_t next = 0;
  for (auto [lo, hi] : s.ranges) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= Grammar::kMaxCodePoint) out.emplace_back(next, Grammar::kMaxCodePoint);
  return normalized(std::move(out));
}

CodePointSet one(uint32_t cp) { return normalized({{cp, cp}}); }
CodePointSet any_character() { return normalized({{0, Grammar::kMaxCodePoint}}); }

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

bool CodePointSet::contains(uint32_t cp) const { return intersects(cp, cp); }

bool CodePointSet::intersects(uint32_t lo, uint32_t hi) const {
  // The first range that ends at or after lo.
  auto it = std::lower_bound(ranges.begin(), ranges.end(), lo,
                             [](const Range& r, uint32_t v) { return r.second < v; });
  return it != ranges.end() && it->first <= hi;
}

// Rules as they are parsed: names, alternatives of symbols, character sets;
// then the checks that make them walkable, and the flat form.
class GrammarBuilder {
 public:
  struct Sym {
    bool rule;
    uint32_t arg;
  };
  using Seq = std::vector<Sym>;

  explicit GrammarBuilder(std::string where) : where_(std::move(where)) {}

  [[noreturn]] void fail(const std::string& what) const { throw core::ConfigError(where_ + ": " + what); }
  [[noreturn]] void fail_at(size_t at, const std::string& what) const {
    fail(what + " (at byte " + std::to_string(at) + ")");
  }

  uint32_t rule(const std::string& name) {
    if (auto it = by_name_.find(name); it != by_name_.end()) return it->second;
    const auto r = uint32_t(names_.size());
    names_.push_back(name);
    alts_.emplace_back();
    defined_.push_back(false);
    by_name_[name] = r;
    return r;
  }
  // A rule of its own for a group or a repetition in rule `base`; '#' is
  // no name character, so it never meets a user's rule.
  uint32_t fresh(const std::string& base) { return rule(base + "#" + std::to_string(names_.size())); }

  void define(uint32_t r, std::vector<Seq> alts, size_t at) {
    if (defined_[r]) fail_at(at, "rule '" + names_[r] + "' is defined twice");
    for (const Seq& s : alts) count(s.size() + 1);
    defined_[r] = true;
    alts_[r] = std::move(alts);
  }

  Sym chars(CodePointSet s, size_t at) {
    if (s.ranges.empty()) fail_at(at, "a character class that matches nothing");
    auto [it, added] = set_index_.try_emplace(s.ranges, uint32_t(sets_.size()));
    if (added) sets_.push_back(std::move(s));
    return {false, it->second};
  }
  static Sym ref(uint32_t r) { return {true, r}; }

  // seq[from..] repeated min to max times (max < 0: no limit), written out
  // as llama.cpp does: min copies, then a rule `x ::= item x | ` for no
  // limit, or max - min nested optional copies.
  void repeat(Seq& seq, size_t from, int64_t min, int64_t max, const std::string& base, size_t at) {
    if (min > Grammar::kMaxRepeat || max > Grammar::kMaxRepeat)
      fail_at(at, "a repetition count over " + std::to_string(Grammar::kMaxRepeat));
    if (max >= 0 && max < min) fail_at(at, "a repetition {m,n} with n < m");
    Seq item(seq.begin() + std::ptrdiff_t(from), seq.end());
    seq.resize(from);
    if (item.empty() || max == 0) return;
    Sym unit = item[0];
    if (item.size() > 1) {  // several symbols (a literal) become one rule, so copies nest it
      const uint32_t r = fresh(base);
      define(r, {item}, at);
      unit = ref(r);
    }
    for (int64_t i = 0; i < min; ++i) seq.push_back(unit);
    if (max < 0) {
      const uint32_t r = fresh(base);
      define(r, {{unit, ref(r)}, {}}, at);
      seq.push_back(ref(r));
    } else if (max > min) {
      Seq tail;
      for (int64_t i = min; i < max; ++i) {
        const uint32_t r = fresh(base);
        Seq more{unit};
        more.insert(more.end(), tail.begin(), tail.end());
        define(r, {more, {}}, at);
        tail = {ref(r)};
      }
      seq.insert(seq.end(), tail.begin(), tail.end());
    }
    count(seq.size() - from);  // what the repetition wrote (counting all of seq each time was quadratic)
  }

  std::shared_ptr<const Grammar> finish(uint32_t root, const std::string& source) {
    for (uint32_t r = 0; r < names_.size(); ++r)
      if (!defined_[r]) fail("rule '" + names_[r] + "' is used but never defined");
    const std::vector<bool> reach = reachable(root);
    check_productive(reach);
    check_left_recursion(reach);
    auto g = std::make_shared<Grammar>();
    g->source_ = source;
    g->root_ = root;
    g->sets_ = std::move(sets_);
    g->rule_names_ = names_;
    for (uint32_t r = 0; r < names_.size(); ++r) {
      g->rules_.emplace_back();
      for (const Seq& alt : alts_[r]) {
        g->rules_.back().push_back(uint32_t(g->symbols_.size()));
        for (const Sym& s : alt)
          g->symbols_.push_back({s.rule ? GrammarSymbol::kRule : GrammarSymbol::kChars, s.arg});
        g->symbols_.push_back({GrammarSymbol::kEnd, 0});
      }
    }
    return g;
  }

  bool has(const std::string& name) const { return by_name_.count(name) != 0; }

 private:
  void count(size_t n) {
    symbols_ += n;
    if (symbols_ > Grammar::kMaxSymbols)
      fail("the grammar has more than " + std::to_string(Grammar::kMaxSymbols) +
           " symbols once its repetitions are written out");
  }

  // "rule 'x'", or for a rule made for a group or repetition, the rule it is in.
  std::string shown(uint32_t r) const {
    const std::string& n = names_[r];
    const size_t hash = n.find('#');
    return hash == std::string::npos ? "rule '" + n + "'" : "a group or repetition in rule '" + n.substr(0, hash) + "'";
  }

  std::vector<bool> reachable(uint32_t root) const {
    std::vector<bool> seen(names_.size());
    std::vector<uint32_t> todo{root};
    seen[root] = true;
    while (!todo.empty()) {
      const uint32_t r = todo.back();
      todo.pop_back();
      for (const Seq& alt : alts_[r])
        for (const Sym& s : alt)
          if (s.rule && !seen[s.arg]) seen[s.arg] = true, todo.push_back(s.arg);
    }
    return seen;
  }

  // The rules that hold, where a rule holds when one of its alternatives'
  // symbols all do (a character set holds when `sets_hold`): a worklist,
  // linear in the grammar's size (a sweep until nothing changes was
  // quadratic on a chain of rules).
  std::vector<bool> fixpoint(bool sets_hold) const {
    std::vector<bool> holds(names_.size());
    std::vector<uint32_t> alt_rule, todo;
    std::vector<size_t> waiting;                          // per alternative: rule symbols not yet known to hold
    std::vector<std::vector<uint32_t>> uses(names_.size());  // per rule: the alternatives it stands in
    for (uint32_t r = 0; r < names_.size(); ++r)
      for (const Seq& alt : alts_[r]) {
        const auto a = uint32_t(alt_rule.size());
        alt_rule.push_back(r);
        size_t n = 0;
        bool blocked = false;
        for (const Sym& s : alt) {
          if (s.rule) ++n, uses[s.arg].push_back(a);
          else blocked |= !sets_hold;
        }
        waiting.push_back(blocked ? std::numeric_limits<size_t>::max() : n);
        if (n == 0 && !blocked && !holds[r]) holds[r] = true, todo.push_back(r);
      }
    while (!todo.empty()) {
      const uint32_t r = todo.back();
      todo.pop_back();
      for (uint32_t a : uses[r])
        if (waiting[a] != std::numeric_limits<size_t>::max() && --waiting[a] == 0 && !holds[alt_rule[a]])
          holds[alt_rule[a]] = true, todo.push_back(alt_rule[a]);
    }
    return holds;
  }

  // A rule that derives no finite text would trap the walk: once in it,
  // the text could never end.
  void check_productive(const std::vector<bool>& reach) const {
    const std::vector<bool> ends = fixpoint(true);
    for (uint32_t r = 0; r < names_.size(); ++r)
      if (reach[r] && !ends[r])
        fail(shown(r) + " can never end: each of its alternatives leads back to it (give one that does not)");
  }

  // Left recursion (a rule reached again before any character, with more
  // to follow it) would make the expansion of a rule grow forever. A rule
  // reached again as the last symbol of what led to it comes back with what
  // followed it the first time (`r ::= x r | ` with x nullable, which a
  // repeated group that may be empty writes): the walk expands that stack
  // once and stops, so only cycles through an edge that is not last are
  // refused. Kosaraju's components, iteratively: rules may chain deep.
  void check_left_recursion(const std::vector<bool>& reach) const {
    const std::vector<bool> nullable = fixpoint(false);
    struct Edge {
      uint32_t to;
      bool last;  // the rule is its alternative's last symbol
    };
    const size_t n = names_.size();
    std::vector<std::vector<Edge>> first(n);  // rules that may come first in r
    std::vector<std::vector<uint32_t>> back(n);
    for (uint32_t r = 0; r < n; ++r)
      for (const Seq& alt : alts_[r])
        for (size_t i = 0; i < alt.size(); ++i) {
          const Sym& s = alt[i];
          if (s.rule) first[r].push_back({s.arg, i + 1 == alt.size()}), back[s.arg].push_back(r);
          if (!s.rule || !nullable[s.arg]) break;
        }
    std::vector<uint32_t> order;  // by finishing time
    std::vector<bool> seen(n);
    for (uint32_t start = 0; start < n; ++start) {
      if (!reach[start] || seen[start]) continue;
      std::vector<std::pair<uint32_t, size_t>> stack{{start, 0}};
      seen[start] = true;
      while (!stack.empty()) {
        auto& [r, i] = stack.back();
        if (i == first[r].size()) {
          order.push_back(r);
          stack.pop_back();
          continue;
        }
        const uint32_t next = first[r][i++].to;
        if (!seen[next]) seen[next] = true, stack.emplace_back(next, 0);
      }
    }
    constexpr uint32_t kNone = ~0u;
    std::vector<uint32_t> component(n, kNone);
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      if (component[*it] != kNone) continue;
      std::vector<uint32_t> todo{*it};
      component[*it] = *it;
      while (!todo.empty()) {
        const uint32_t r = todo.back();
        todo.pop_back();
        for (uint32_t from : back[r])
          if (reach[from] && component[from] == kNone) component[from] = *it, todo.push_back(from);
      }
    }
    for (uint32_t r = 0; r < n; ++r)
      for (const Edge& e : first[r])
        if (reach[r] && !e.last && component[e.to] == component[r]) fail_left_recursion(r, e.to, first);
  }

  // Names the cycle r -> to -> ... -> r (a path back from `to`, found breadth first).
  template <class Graph>
  [[noreturn]] void fail_left_recursion(uint32_t r, uint32_t to, const Graph& first) const {
    std::vector<uint32_t> parent(names_.size(), ~0u);
    std::vector<uint32_t> todo{to};
    parent[to] = to;
    for (size_t i = 0; i < todo.size() && parent[r] == ~0u; ++i)
      for (const auto& e : first[todo[i]])
        if (parent[e.to] == ~0u) parent[e.to] = todo[i], todo.push_back(e.to);
    std::vector<uint32_t> cycle{r};
    for (uint32_t at = r; at != to && parent[at] != ~0u; at = parent[at]) cycle.push_back(parent[at]);
    std::string path = names_[r].substr(0, names_[r].find('#'));
    for (auto it = cycle.rbegin(); it != cycle.rend(); ++it) path += " -> " + names_[*it].substr(0, names_[*it].find('#'));
    fail(shown(r) + " is left-recursive (" + path +
         "): it can reach itself before any character; write it with a repetition, e.g. "
         "expr ::= term (\"+\" term)*");
  }

  std::string where_;
  std::vector<std::string> names_;
  std::vector<std::vector<Seq>> alts_;
  std::vector<bool> defined_;
  std::map<std::string, uint32_t> by_name_;
  std::vector<CodePointSet> sets_;
  std::map<std::vector<Range>, uint32_t> set_index_;
  size_t symbols_ = 0;
};

namespace {

// What GBNF and regular expressions read alike: UTF-8 and escapes.
class Reader {
 public:
  Reader(GrammarBuilder& b, std::string_view s) : b_(b), s_(s) {}

 protected:
  bool eof() const { return pos_ >= s_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < s_.size() ? s_[pos_ + ahead] : '\0'; }
  bool eat(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }
  [[noreturn]] void fail(const std::string& what) const { b_.fail_at(pos_, what); }

  // Groups are parsed recursively: past this depth a request's pattern
  // would overflow the stack of the thread parsing it (a 100 KB body of
  // '(' did). Opened by each group, closed when its ')' is read.
  static constexpr int kMaxNesting = 256;
  void open_group() {
    if (++depth_ > kMaxNesting) fail("groups nest more than " + std::to_string(kMaxNesting) + " deep");
  }
  void close_group() { --depth_; }
  int depth_ = 0;

  // The text of an unknown escape's character, for its message.
  static std::string shown(char c) {
    return uint8_t(c) >= 0x20 && uint8_t(c) < 0x7F ? std::string(1, c) : "(a byte " + std::to_string(uint8_t(c)) + ")";
  }

  // One UTF-8 character of the source.
  uint32_t character() {
    const auto c = uint8_t(s_[pos_]);
    const int n = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : -1;
    if (n < 0 || pos_ + size_t(n) >= s_.size()) fail("the text is not UTF-8");
    uint32_t cp = n == 0 ? c : c & (0x3F >> n);
    for (int i = 1; i <= n; ++i) {
      const auto k = uint8_t(s_[pos_ + size_t(i)]);
      if ((k & 0xC0) != 0x80) fail("the text is not UTF-8");
      cp = cp << 6 | (k & 0x3F);
    }
    static constexpr uint32_t kLeast[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kLeast[n] || cp > Grammar::kMaxCodePoint || (cp >= kSurrogateFirst && cp <= kSurrogateLast))
      fail("the text is not UTF-8");
    pos_ += size_t(n) + 1;
    return cp;
  }

  // The digits of \x, \u or \U, after the letter.
  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i, ++pos_) {
      const int h = hex_value(peek());
      if (h < 0) fail("expected " + std::to_string(digits) + " hex digits in an escape");
      v = v << 4 | uint32_t(h);
    }
    if (v > Grammar::kMaxCodePoint || (v >= kSurrogateFirst && v <= kSurrogateLast))
      fail("an escape of no Unicode character");
    return v;
  }

  // \n \r \t \xHH \uHHHH, after the backslash and the letter c; false when
  // c is none of these.
  bool common_escape(char c, uint32_t& cp) {
    switch (c) {
      case 'n': cp = '\n'; return true;
      case 'r': cp = '\r'; return true;
      case 't': cp = '\t'; return true;
      case 'x': cp = hex(2); return true;
      case 'u': cp = hex(4); return true;
      default: return false;
    }
  }

  GrammarBuilder& b_;
  std::string_view s_;
  size_t pos_ = 0;
};

class GbnfParser : Reader {
 public:
  using Reader::Reader;

  uint32_t run() {
    space(true);
    if (eof()) fail("the grammar is empty: give at least `root ::= ...`");
    while (!eof()) rule();
    if (!b_.has("root")) b_.fail("no rule 'root': a grammar starts at root");
    return b_.rule("root");
  }

 private:
  using Seq = GrammarBuilder::Seq;

  void rule() {
    const size_t at = pos_;
    const std::string name = this->name();
    if (name.empty()) fail("expected a rule name");
    space(false);
    if (!eat("::=")) fail("expected ::= after the rule name '" + name + "'");
    space(true);
    std::vector<Seq> alts = alternates(name, false);
    space(false);
    if (!eof() && peek() != '\n') fail("expected the end of rule '" + name + "'");
    space(true);
    b_.define(b_.rule(name), std::move(alts), at);
  }

  std::string name() {
    const size_t from = pos_;
    while (!eof() && is_name_char(peek())) ++pos_;
    return std::string(s_.substr(from, pos_ - from));
  }

  // Blanks and comments; newlines too where a rule goes on.
  void space(bool newlines) {
    while (!eof()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) ++pos_;
      else if (c == '#') while (!eof() && peek() != '\n') ++pos_;
      else break;
    }
  }

  // At the top level a rule ends with its line, unless the next line
  // begins with `|` (an alternative written below the first).
  bool next_line_continues() {
    size_t p = pos_;
    while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t' || s_[p] == '\r' || s_[p] == '\n' || s_[p] == '#')) {
      if (s_[p] == '#') while (p < s_.size() && s_[p] != '\n') ++p;
      else ++p;
    }
    if (p < s_.size() && s_[p] == '|') return pos_ = p, true;
    return false;
  }

  std::vector<Seq> alternates(const std::string& base, bool nested) {
    std::vector<Seq> alts{sequence(base, nested)};
    while (peek() == '|' || (!nested && next_line_continues())) {
      ++pos_;
      space(true);
      alts.push_back(sequence(base, nested));
    }
    return alts;
  }

  Seq sequence(const std::string& base, bool nested) {
    Seq seq;
    size_t last = std::string::npos;  // where the last element's symbols begin
    while (!eof()) {
      const size_t at = pos_;
      const char c = peek();
      if (c == '"') {
        last = seq.size();
        ++pos_;
        while (peek() != '"') {
          if (eof() || peek() == '\n') fail("a literal without its closing \"");
          const uint32_t cp = literal_char();
          seq.push_back(b_.chars(one(cp), at));
        }
        ++pos_;
      } else if (c == '[') {
        last = seq.size();
        seq.push_back(b_.chars(klass(), at));
      } else if (c == '.') {
        last = seq.size();
        ++pos_;
        seq.push_back(b_.chars(any_character(), at));
      } else if (is_name_char(c)) {
        last = seq.size();
        seq.push_back(GrammarBuilder::ref(b_.rule(name())));
      } else if (c == '(') {
        last = seq.size();
        ++pos_;
        open_group();
        space(true);
        std::vector<Seq> alts = alternates(base, true);
        if (peek() != ')') fail("expected ')'");
        ++pos_;
        close_group();
        const uint32_t r = b_.fresh(base);
        b_.define(r, std::move(alts), at);
        seq.push_back(GrammarBuilder::ref(r));
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (last == std::string::npos) fail(std::string("'") + c + "' repeats nothing");
        int64_t min = 0, max = -1;
        ++pos_;
        if (c == '+') min = 1;
        else if (c == '?') max = 1;
        else if (c == '{') braces(min, max);
        b_.repeat(seq, last, min, max, base, at);
        last = std::string::npos;
      } else {
        break;
      }
      space(nested);
    }
    return seq;
  }

  // {m}, {m,}, {m,n} or {,n}, after the '{'.
  void braces(int64_t& min, int64_t& max) {
    auto number = [&](int64_t& v) {
      if (peek() < '0' || peek() > '9') return false;
      v = 0;
      while (peek() >= '0' && peek() <= '9') {
        v = v * 10 + (peek() - '0');
        if (v > Grammar::kMaxRepeat) fail("a repetition count over " + std::to_string(Grammar::kMaxRepeat));
        ++pos_;
      }
      return true;
    };
    space(false);
    const bool has_min = number(min);
    space(false);
    if (eat(",")) {
      space(false);
      if (!number(max)) max = -1;
      if (!has_min && max < 0) fail("a repetition {,} gives no count");
    } else {
      if (!has_min) fail("expected a count in {}");
      max = min;
    }
    space(false);
    if (!eat("}")) fail("expected '}' after a repetition count");
  }

  uint32_t escape() {
    ++pos_;  // the backslash
    const char c = peek();
    if (eof()) fail("an escape at the end of the text");
    ++pos_;
    uint32_t cp = 0;
    if (common_escape(c, cp)) return cp;
    if (c == 'U') return hex(8);
    if (c == '\\' || c == '"' || c == '[' || c == ']' || c == '-' || c == '^') return uint8_t(c);
    --pos_;
    fail("unknown escape \\" + shown(c));
  }

  uint32_t literal_char() { return peek() == '\\' ? escape() : character(); }

  CodePointSet klass() {
    ++pos_;  // '['
    const bool negate = eat("^");
    std::vector<Range> ranges;
    while (peek() != ']') {
      if (eof() || peek() == '\n') fail("a character class without its closing ]");
      const uint32_t lo = literal_char();
      uint32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && peek(1) != '\n' && pos_ + 1 < s_.size()) {
        ++pos_;
        hi = literal_char();
        if (hi < lo) fail("a range in a class that runs backwards");
      }
      ranges.emplace_back(lo, hi);
    }
    ++pos_;
    CodePointSet s = normalized(std::move(ranges));
    return negate ? complement(s) : s;
  }
};

class RegexParser : Reader {
 public:
  using Reader::Reader;

  uint32_t run() {
    std::vector<Seq> alts = alternation();
    if (!eof()) fail("an unmatched ')'");
    const uint32_t root = b_.rule("regex");
    b_.define(root, std::move(alts), 0);
    return root;
  }

 private:
  using Seq = GrammarBuilder::Seq;

  std::vector<Seq> alternation() {
    std::vector<Seq> alts{sequence()};
    while (eat("|")) alts.push_back(sequence());
    return alts;
  }

  Seq sequence() {
    Seq seq;
    size_t last = std::string::npos;
    while (!eof() && peek() != '|' && peek() != ')') {
      const size_t at = pos_;
      const char c = peek();
      int64_t min = 0, max = -1;
      if (c == '*' || c == '+' || c == '?' || (c == '{' && quantifier_braces(min, max, true))) {
        if (last == std::string::npos) fail(std::string("'") + c + "' repeats nothing");
        if (c == '{') quantifier_braces(min, max, false);
        else ++pos_;
        if (c == '+') min = 1;
        else if (c == '?') max = 1;
        if (peek() == '+') fail("possessive repetition (*+, ++, ?+) is not supported");
        eat("?");  // lazy: the same texts match whole
        b_.repeat(seq, last, min, max, "regex", at);
        last = std::string::npos;
        continue;
      }
      last = seq.size();
      if (c == '(') {
        seq.push_back(group());
      } else if (c == '[') {
        seq.push_back(b_.chars(klass(), at));
      } else if (c == '.') {
        ++pos_;
        seq.push_back(b_.chars(complement(one('\n')), at));
      } else if (c == '\\') {
        seq.push_back(b_.chars(escape(false), at));
      } else if (c == '$') {  // at the end of a whole alternative only: the text must end there
        ++pos_;
        if (depth_ > 0 || (!eof() && peek() != '|'))
          fail("'$' anywhere but at the end of the pattern or of one of its alternatives (the whole text must match)");
        last = std::string::npos;
      } else if (c == '^') {
        ++pos_;
        if (depth_ > 0 || !seq.empty())
          fail("'^' anywhere but at the start of the pattern or of one of its alternatives (the whole text must match)");
        last = std::string::npos;
      } else {
        seq.push_back(b_.chars(one(character()), at));
      }
    }
    return seq;
  }

  GrammarBuilder::Sym group() {
    const size_t at = pos_;
    ++pos_;  // '('
    open_group();
    if (eat("?")) {
      if (eat(":")) {
      } else if (eat("P<") || (peek() == '<' && peek(1) != '=' && peek(1) != '!' && eat("<"))) {
        while (!eof() && peek() != '>') ++pos_;
        if (!eat(">")) fail("a group name without its closing >");
      } else if (peek() == '=' || peek() == '!' || peek() == '<') {
        fail("lookaround ((?=, (?!, (?<=, (?<!) is not supported: a whole-text match has no lookaround");
      } else {
        fail("inline flags and other (? groups are not supported");
      }
    }
    std::vector<Seq> alts = alternation();
    if (!eat(")")) fail("a group without its closing ')'");
    close_group();
    const uint32_t r = b_.fresh("regex");
    b_.define(r, std::move(alts), at);
    return GrammarBuilder::ref(r);
  }

  // {m}, {m,} or {m,n}; `probe`: only whether one stands here (else '{' is
  // a literal, as in Python's and JavaScript's regular expressions).
  bool quantifier_braces(int64_t& min, int64_t& max, bool probe) {
    size_t p = pos_ + 1;
    auto number = [&](int64_t& v) {
      const size_t from = p;
      v = 0;
      while (p < s_.size() && s_[p] >= '0' && s_[p] <= '9') {
        v = std::min<int64_t>(v * 10 + (s_[p] - '0'), int64_t(Grammar::kMaxRepeat) + 1);
        ++p;
      }
      return p > from;
    };
    const bool has_min = number(min);  // {,n}: no least count is 0, as in Python
    if (!has_min) min = 0;
    max = min;
    if (p < s_.size() && s_[p] == ',') {
      ++p;
      if (!number(max)) max = -1;
    } else if (!has_min) {
      return false;
    }
    if (p >= s_.size() || s_[p] != '}') return false;
    if (!probe) pos_ = p + 1;
    return true;
  }

  // A class escape (\d \w \s and their negations) or one character.
  CodePointSet escape(bool in_class) {
    ++pos_;  // the backslash
    if (eof()) fail("an escape at the end of the pattern");
    const char c = peek();
    ++pos_;
    static const CodePointSet digit = normalized({{'0', '9'}});
    static const CodePointSet word = normalized({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}});
    static const CodePointSet space = normalized({{'\t', '\r'}, {' ', ' '}});
    uint32_t cp = 0;
    switch (c) {
      case 'd': return digit;
      case 'D': return complement(digit);
      case 'w': return word;
      case 'W': return complement(word);
      case 's': return space;
      case 'S': return complement(space);
      case 'f': return one('\f');
      case 'v': return one('\v');
      case 'a': return one('\a');
      default: break;
    }
    // Octal as Python reads it: \0 and up to two more octal digits, or
    // three octal digits; inside a class any octal digit and up to two
    // more. Other digits are backreferences.
    auto octal = [&](size_t at) { return at < s_.size() && s_[at] >= '0' && s_[at] <= '7'; };
    if (c == '0' || (in_class && octal(pos_ - 1)) || (c <= '3' && octal(pos_ - 1) && octal(pos_) && octal(pos_ + 1))) {
      uint32_t v = uint32_t(c - '0');
      for (int i = 0; i < 2 && octal(pos_); ++i) v = v * 8 + uint32_t(s_[pos_++] - '0');
      if (v > 0377) fail("an octal escape past \\377");
      return one(v);
    }
    if (common_escape(c, cp)) return one(cp);
    if (c == 'b' && in_class) return one('\b');
    if (c == 'b' || c == 'B' || c == 'A' || c == 'Z' || c == 'z' || c == 'G') {
      --pos_;
      fail(std::string("the anchor \\") + c + " is not supported: the whole text must match");
    }
    if (c >= '1' && c <= '9') {
      --pos_;
      fail("backreferences are not supported: they match no regular language");
    }
    // Any other character but an ASCII letter or digit stands for itself
    // (Python's rule: those are kept for escapes of their own).
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (uint8_t(c) >= 0x80) return --pos_, one(character());
    if (!alnum) return one(uint8_t(c));
    --pos_;
    fail("unknown escape \\" + shown(c));
  }

  CodePointSet klass() {
    ++pos_;  // '['
    const bool negate = eat("^");
    std::vector<Range> ranges;
    bool first = true;
    while (first || peek() != ']') {  // a ']' first is a literal one
      if (eof()) fail("a character class without its closing ]");
      first = false;
      CodePointSet lo_set = peek() == '\\' ? escape(true) : one(character());
      const bool single = lo_set.ranges.size() == 1 && lo_set.ranges[0].first == lo_set.ranges[0].second;
      if (peek() == '-' && pos_ + 1 < s_.size() && peek(1) != ']') {  // a range (a '-' last is a literal)
        if (!single) fail("a range in a class that begins with a class escape (\\d, \\w, \\s...)");
        ++pos_;
        const CodePointSet hi_set = peek() == '\\' ? escape(true) : one(character());
        if (hi_set.ranges.size() != 1 || hi_set.ranges[0].first != hi_set.ranges[0].second)
          fail("a range in a class that ends in a class escape");
        if (hi_set.ranges[0].first < lo_set.ranges[0].first) fail("a range in a class that runs backwards");
        ranges.emplace_back(lo_set.ranges[0].first, hi_set.ranges[0].first);
      } else {
        ranges.insert(ranges.end(), lo_set.ranges.begin(), lo_set.ranges.end());
      }
    }
    ++pos_;
    CodePointSet s = normalized(std::move(ranges));
    return negate ? complement(s) : s;
  }
};

}  // namespace

std::shared_ptr<const Grammar> Grammar::gbnf(std::string_view text, const std::string& where) {
  GrammarBuilder b(where);
  GbnfParser p(b, text);
  const uint32_t root = p.run();
  return b.finish(root, "gbnf:" + std::string(text));
}

std::shared_ptr<const Grammar> Grammar::regex(std::string_view pattern, const std::string& where) {
  GrammarBuilder b(where);
  RegexParser p(b, pattern);
  const uint32_t root = p.run();
  return b.finish(root, "regex:" + std::string(pattern));
}

}  // namespace brisk::infer
