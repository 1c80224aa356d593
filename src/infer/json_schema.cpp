// Compiling a JSON Schema for constrained generation; see
// brisk/infer/json_schema.h for the subset and why the rest is refused.
#include "brisk/infer/json_schema.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "brisk/core/error.h"
#include "brisk/core/json_nesting.h"

namespace brisk::infer {

using ojson = nlohmann::ordered_json;
using Node = JsonSchemaNode;

namespace {

// Assertions the subset does not enforce: refused rather than ignored.
const std::set<std::string> kRefused = {
    "pattern",          "patternProperties", "propertyNames",    "minProperties",      "maxProperties",
    "dependentRequired", "dependentSchemas", "dependencies",     "unevaluatedProperties", "unevaluatedItems",
    "minimum",          "maximum",           "exclusiveMinimum", "exclusiveMaximum",   "multipleOf",
    "prefixItems",      "contains",          "minContains",      "maxContains",        "additionalItems",
    "not",              "if",                "then",             "else",               "$dynamicRef",
    "$recursiveRef",    "contentSchema"};

// Keywords that shape a value here; any other (title, description, default,
// format, $defs...) is an annotation or unknown, which JSON Schema ignores.
const std::set<std::string> kShaping = {"type",      "enum",      "const",     "properties", "required",
                                        "additionalProperties",   "items",     "minItems",   "maxItems",
                                        "minLength", "maxLength", "anyOf",     "oneOf",      "allOf",
                                        "$ref",      "uniqueItems"};

std::string named(const std::string& s) { return "'" + s + "'"; }

}  // namespace

class JsonSchemaCompiler {
 public:
  JsonSchemaCompiler(const ojson& doc, JsonSchema& out) : doc_(doc), out_(out) {}

  const Node* run(const std::string& name) {
    name_ = name;
    const Node* root = resolve(walk(doc_, name));
    for (auto& n : out_.nodes_) link(*n);
    for (auto& n : out_.nodes_)
      if (!n->alias) first_bytes(*n);
    depths();
    // Only the root's objects and arrays are written (a value the text can
    // close: a number at the top level has no last digit).
    if ((root->first & kContainers).none())
      fail(name, "the root must allow an object or an array (a number at the top level has no last digit)");
    if (container_depth(*root) > Node::kMaxDepth)
      fail(name, "every instance nests more than " + std::to_string(Node::kMaxDepth) + " containers deep");
    return root;
  }

 private:
  static inline const std::bitset<256> kContainers = [] {
    std::bitset<256> b;
    b.set('{'), b.set('[');
    return b;
  }();

  [[noreturn]] static void fail(const std::string& path, const std::string& what) {
    throw core::ConfigError(path + ": " + what);
  }

  Node* make(const std::string& path) {
    out_.nodes_.push_back(std::make_unique<Node>());
    paths_[out_.nodes_.back().get()] = path;
    return out_.nodes_.back().get();
  }

  // `true`: any value. One node, shared.
  const Node* any() {
    if (!any_) {
      Node* n = make("true");
      n->kinds = Node::kAll;
      n->additional = n;
      n->items = n;
      any_ = n;
    }
    return any_;
  }

  static int64_t count(const ojson& s, const char* key, const std::string& path) {
    const ojson& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      fail(path, named(key) + " must be a non-negative integer");
    return v.get<int64_t>();
  }

  static constexpr int kMaxNesting = 64;  // schemas within schemas (the walk recurses)

  const Node* walk(const ojson& s, const std::string& path) {
    if (depth_ >= kMaxNesting) fail(path, "schemas nest deeper than " + std::to_string(kMaxNesting));
    ++depth_;
    const Node* n = walk_in(s, path);
    --depth_;
    return n;
  }

  const Node* walk_in(const ojson& s, const std::string& path) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail(path, "the schema false allows no value");
      return any();
    }
    if (!s.is_object()) fail(path, "a schema must be an object or a boolean");
    for (const auto& [key, v] : s.items()) {
      if (kRefused.count(key)) fail(path, named(key) + " is not supported");
      if (key == "uniqueItems" && !(v.is_boolean() && !v.get<bool>()))
        fail(path, "'uniqueItems' is not supported (only false)");
    }
    // At most one of the forms below; only `type` may sit beside enum/const.
    std::vector<std::string> forms, shapes;
    for (const char* f : {"$ref", "allOf", "anyOf", "oneOf", "enum", "const"})
      if (s.contains(f)) forms.push_back(f);
    for (const auto& [key, v] : s.items())
      if (kShaping.count(key) && key != "uniqueItems" &&
          std::find(forms.begin(), forms.end(), key) == forms.end())
        shapes.push_back(key);
    if (forms.size() > 1) fail(path, named(forms[0]) + " beside " + named(forms[1]) + " is not supported");
    if (!forms.empty() && !shapes.empty() &&
        !((forms[0] == "enum" || forms[0] == "const") && shapes.size() == 1 && shapes[0] == "type"))
      fail(path, named(forms[0]) + " beside " + named(shapes[0]) + " is not supported");

    Node* n = make(path);
    const std::string form = forms.empty() ? "" : forms[0];
    if (form == "$ref") {
      n->alias = ref(s["$ref"], path + ".$ref");
    } else if (form == "allOf") {
      const ojson& all = s["allOf"];
      if (!all.is_array() || all.size() != 1) fail(path, "'allOf' is supported with one schema only");
      n->alias = walk(all[0], path + ".allOf[0]");
    } else if (form == "anyOf" || form == "oneOf") {
      // oneOf is anyOf here: alternatives that begin with different bytes
      // cannot both match a value.
      const ojson& alts = s[form];
      if (!alts.is_array() || alts.empty()) fail(path, named(form) + " must be a non-empty list of schemas");
      for (size_t i = 0; i < alts.size(); ++i)
        n->any_of.push_back(walk(alts[i], path + "." + form + "[" + std::to_string(i) + "]"));
      n->one_of = form == "oneOf";
    } else {
      n->kinds = s.contains("type") ? kinds(s["type"], path, n->integer) : uint8_t(Node::kAll);
      if (form == "enum" || form == "const") {
        literals(s, form, path, *n);
      } else {
        object(s, path, *n);
        array(s, path, *n);
        if (s.contains("minLength")) n->min_length = count(s, "minLength", path);
        if (s.contains("maxLength")) n->max_length = count(s, "maxLength", path);
        if (n->min_length > n->max_length) fail(path, "'minLength' is above 'maxLength'");
      }
    }
    return n;
  }

  static uint8_t kinds(const ojson& type, const std::string& path, bool& integer) {
    std::vector<ojson> names;
    if (type.is_array()) names.assign(type.begin(), type.end());
    else names.push_back(type);
    if (names.empty()) fail(path, "'type' [] allows no value");
    uint8_t k = 0;
    bool number = false, integer_named = false;
    for (const ojson& t : names) {
      const std::string name = t.is_string() ? t.get<std::string>() : "";
      if (name == "object") k |= Node::kObject;
      else if (name == "array") k |= Node::kArray;
      else if (name == "string") k |= Node::kString;
      else if (name == "number") k |= Node::kNumber, number = true;
      else if (name == "integer") k |= Node::kNumber, integer_named = true;
      else if (name == "boolean") k |= Node::kBoolean;
      else if (name == "null") k |= Node::kNull;
      else fail(path, "'type' " + t.dump() + " is not a JSON type");
    }
    integer = integer_named && !number;
    return k;
  }

  static uint8_t kind_of(const ojson& v) {
    if (v.is_object()) return Node::kObject;
    if (v.is_array()) return Node::kArray;
    if (v.is_string()) return Node::kString;
    if (v.is_number()) return Node::kNumber;
    if (v.is_boolean()) return Node::kBoolean;
    return Node::kNull;
  }

  static void literals(const ojson& s, const std::string& form, const std::string& path, Node& n) {
    std::vector<ojson> values;
    if (form == "const") values.push_back(s["const"]);
    else if (!s["enum"].is_array() || s["enum"].empty()) fail(path, "'enum' must be a non-empty list");
    else values.assign(s["enum"].begin(), s["enum"].end());
    for (const ojson& v : values) {
      if (!(kind_of(v) & n.kinds)) continue;  // `type` rules it out
      if (n.integer && v.is_number_float() && std::floor(v.get<double>()) != v.get<double>()) continue;
      // Past 64 bits an integer is read as a double and its text would be
      // rounded (1.2345678901234568e+29), another number to a validator;
      // the parser keeps no difference between such an integer and 1e20.
      if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() &&
          std::fabs(v.get<double>()) >= 9223372036854775808.0)
        fail(path, named(form) + " holds " + v.dump() +
                       ": a whole number of 2^63 or more in size (an integer past 64 bits, or 1e20) cannot be "
                       "written exactly");
      n.literals.push_back(v.dump());
    }
    if (n.literals.empty()) fail(path, named(form) + " holds no value of the schema's 'type'");
    std::sort(n.literals.begin(), n.literals.end());
    n.literals.erase(std::unique(n.literals.begin(), n.literals.end()), n.literals.end());
  }

  void object(const ojson& s, const std::string& path, Node& n) {
    std::vector<std::string> names;
    if (s.contains("properties")) {
      const ojson& props = s["properties"];
      if (!props.is_object()) fail(path, "'properties' must be an object");
      for (const auto& [name, sub] : props.items()) {
        names.push_back(name);
        n.properties.push_back(walk(sub, path + ".properties." + name));
      }
    }
    std::vector<uint8_t> required(names.size(), 0);
    if (s.contains("required")) {
      const ojson& req = s["required"];
      if (!req.is_array()) fail(path, "'required' must be a list of property names");
      for (const ojson& r : req) {
        if (!r.is_string()) fail(path, "'required' must be a list of property names");
        const auto at = std::find(names.begin(), names.end(), r.get<std::string>());
        if (at == names.end())
          fail(path, "'required' names " + r.dump() + ", which is not in 'properties' (only listed keys are written)");
        required[size_t(at - names.begin())] = 1;
      }
    }
    for (size_t i = 0; i < names.size(); ++i) n.keys.push_back(ojson(names[i]).dump());
    std::vector<int32_t> order(names.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return n.keys[size_t(a)] < n.keys[size_t(b)]; });
    std::vector<std::string> sorted;
    for (int32_t i : order) sorted.push_back(n.keys[size_t(i)]);
    n.keys = std::move(sorted);
    n.key_property = std::move(order);
    n.next_required.assign(names.size() + 1, int32_t(names.size()));
    for (size_t i = names.size(); i-- > 0;) n.next_required[i] = required[i] ? int32_t(i) : n.next_required[i + 1];
    if (!n.keyed()) {
      const ojson extra = s.contains("additionalProperties") ? s["additionalProperties"] : ojson(true);
      if (!(extra.is_boolean() && !extra.get<bool>())) n.additional = walk(extra, path + ".additionalProperties");
    } else if (s.contains("additionalProperties")) {
      const ojson& extra = s["additionalProperties"];
      if (!extra.is_boolean() && !extra.is_object()) fail(path, "'additionalProperties' must be a schema");
    }
  }

  void array(const ojson& s, const std::string& path, Node& n) {
    if (s.contains("items")) {
      if (s["items"].is_array()) fail(path, "'items' as a list (tuple validation) is not supported");
      n.items = walk(s["items"], path + ".items");
    } else {
      n.items = any();
    }
    if (s.contains("minItems")) n.min_items = count(s, "minItems", path);
    if (s.contains("maxItems")) n.max_items = count(s, "maxItems", path);
    if (n.min_items > n.max_items) fail(path, "'minItems' is above 'maxItems'");
  }

  // "#", "#/$defs/Name", "#/definitions/Name" (a JSON pointer into the
  // document); compiled once, so a recursive schema is a cycle of nodes.
  const Node* ref(const ojson& target, const std::string& path) {
    if (!target.is_string()) fail(path, "'$ref' must be a string");
    const std::string t = target.get<std::string>();
    if (const auto at = refs_.find(t); at != refs_.end()) return at->second;
    if (t.empty() || t[0] != '#')
      fail(path, "'$ref' " + named(t) + " is not supported (only references inside the schema: \"#/$defs/...\")");
    const ojson* doc = &doc_;
    try {
      doc = &doc_.at(ojson::json_pointer(t.substr(1)));
    } catch (const ojson::exception&) {
      fail(path, "'$ref' " + named(t) + " points at nothing in the schema");
    }
    Node* n = make(path);  // registered before the walk: the target may refer back to it
    refs_[t] = n;
    std::string target_path = name_;  // "#/$defs/x" -> "schema.$defs.x"
    for (const char c : t.substr(1)) target_path += c == '/' ? '.' : c;
    n->alias = walk(*doc, target_path);
    return n;
  }

  // Follows $ref / allOf links to a node with content.
  const Node* resolve(const Node* n) const {
    const Node* start = n;
    for (size_t steps = 0; n->alias; ++steps) {
      if (steps > out_.nodes_.size())
        fail(paths_.at(start), "'$ref' leads back to itself without a value in between");
      n = n->alias;
    }
    return n;
  }

  void link(Node& n) {
    for (auto& p : n.properties) p = resolve(p);
    for (auto& a : n.any_of) a = resolve(a);
    if (n.items) n.items = resolve(n.items);
    if (n.additional) n.additional = resolve(n.additional);
  }

  // The bytes a value may begin with; anyOf alternatives must not share one.
  const std::bitset<256>& first_bytes(Node& n) {
    int& state = state_[&n];
    if (state == 2) return n.first;
    if (state == 1) fail(paths_.at(&n), "'anyOf' leads back to itself without a value in between");
    state = 1;
    if (!n.any_of.empty()) {
      for (size_t i = 0; i < n.any_of.size(); ++i) {
        const std::bitset<256>& f = first_bytes(const_cast<Node&>(*n.any_of[i]));
        if ((n.first & f).any()) {
          size_t b = 0;
          while (!(n.first & f).test(b)) ++b;
          fail(paths_.at(&n), "'anyOf' alternatives that may begin with the same byte ('" + std::string(1, char(b)) +
                                  "') are not supported: the first byte must pick one (a string or a number, not "
                                  "two strings)");
        }
        n.first |= f;
      }
      if (n.one_of) one_of_disjoint(n);
    } else if (!n.literals.empty()) {
      for (const std::string& l : n.literals) n.first.set(static_cast<unsigned char>(l[0]));
    } else {
      if (n.kinds & Node::kObject) n.first.set('{');
      if (n.kinds & Node::kArray) n.first.set('[');
      if (n.kinds & Node::kString) n.first.set('"');
      if (n.kinds & Node::kNumber)
        for (const char c : std::string("-0123456789")) n.first.set(static_cast<unsigned char>(c));
      if (n.kinds & Node::kBoolean) n.first.set('t'), n.first.set('f');
      if (n.kinds & Node::kNull) n.first.set('n');
    }
    state = 2;
    return n.first;
  }

  // oneOf: alternatives that begin with different bytes match different
  // values, but for numbers written differently that are equal (0, -0.0).
  void one_of_disjoint(const Node& n) const {
    std::vector<std::pair<size_t, ojson>> values;
    for (size_t i = 0; i < n.any_of.size(); ++i) literal_values(*n.any_of[i], i, values);
    for (size_t a = 0; a < values.size(); ++a)
      for (size_t b = a + 1; b < values.size(); ++b)
        if (values[a].first != values[b].first && values[a].second == values[b].second)
          fail(paths_.at(&n), "'oneOf' alternatives " + std::to_string(values[a].first) + " and " +
                                  std::to_string(values[b].first) + " both match " + values[a].second.dump());
  }

  // An alternative's enum and const values, through the anyOf / oneOf it
  // may itself be (tagged with the alternative's index).
  static void literal_values(const Node& n, size_t alternative, std::vector<std::pair<size_t, ojson>>& out) {
    for (const std::string& l : n.literals) out.emplace_back(alternative, ojson::parse(l));
    for (const Node* a : n.any_of) literal_values(*a, alternative, out);
  }

  static constexpr int32_t kInfinite = 1 << 30;

  // The fewest containers a value opens (JsonSchemaNode::min_depth): a
  // least fixed point, children before parents (nodes are made parents
  // first, so the sweeps go backwards). kInfinite: no finite value, which
  // is refused: generation could only nest deeper.
  void depths() const {
    for (auto& p : out_.nodes_) p->min_depth = p->object_depth = p->array_depth = kInfinite;
    for (bool changed = true; changed;) {
      changed = false;
      for (auto it = out_.nodes_.rbegin(); it != out_.nodes_.rend(); ++it) {
        Node& n = **it;
        if (n.alias) continue;
        int32_t object = kInfinite, array = kInfinite, least = kInfinite;
        if (!n.literals.empty() || (n.kinds & (Node::kString | Node::kNumber | Node::kBoolean | Node::kNull)))
          least = 0;
        for (const Node* a : n.any_of) least = std::min(least, a->min_depth);
        if (n.kinds & Node::kArray)
          array = n.min_items == 0 ? 1 : std::min(kInfinite, 1 + n.items->min_depth);
        if (n.kinds & Node::kObject) {
          object = 1;
          for (size_t i = 0; i < n.properties.size(); ++i)
            if (n.next_required[i] == int32_t(i)) object = std::max(object, std::min(kInfinite, 1 + n.properties[i]->min_depth));
        }
        least = std::min({least, object, array});
        if (least != n.min_depth || object != n.object_depth || array != n.array_depth) {
          n.min_depth = least, n.object_depth = object, n.array_depth = array;
          changed = true;
        }
      }
    }
    for (const auto& p : out_.nodes_)
      if (!p->alias && p->min_depth == kInfinite)
        fail(paths_.at(p.get()), "the schema has no finite value (a required property or item leads back to it)");
  }

  // The fewest containers a root value opens: only its objects and arrays
  // are written (an enum's text opens none on the automaton's stack).
  static int32_t container_depth(const Node& n) {
    if (!n.any_of.empty()) {
      int32_t d = kInfinite;
      for (const Node* a : n.any_of) d = std::min(d, container_depth(*a));
      return d;
    }
    if (!n.literals.empty()) return (n.first & kContainers).any() ? 0 : kInfinite;
    return std::min(n.kinds & Node::kObject ? n.object_depth : kInfinite, n.kinds & Node::kArray ? n.array_depth : kInfinite);
  }

  const ojson& doc_;
  JsonSchema& out_;
  const Node* any_ = nullptr;
  std::string name_;
  int depth_ = 0;
  std::map<std::string, Node*> refs_;
  std::map<const Node*, std::string> paths_;
  std::map<const Node*, int> state_;
};

std::shared_ptr<const JsonSchema> JsonSchema::compile(const ojson& schema, const std::string& name) {
  constexpr size_t kMaxJsonNesting = 256;
  if (core::json_nesting(schema) > kMaxJsonNesting)
    throw core::ConfigError(name + ": the schema's JSON nests deeper than " + std::to_string(kMaxJsonNesting) + " levels");
  std::shared_ptr<JsonSchema> s(new JsonSchema());
  s->text_ = schema.dump();
  s->root_ = JsonSchemaCompiler(schema, *s).run(name);
  return s;
}

std::shared_ptr<const JsonSchema> JsonSchema::compile_text(const std::string& text, const std::string& name) {
  ojson schema;
  try {
    schema = ojson::parse(text);
  } catch (const ojson::exception& e) {
    throw core::ConfigError(name + ": not JSON (" + e.what() + ")");
  }
  return compile(schema, name);
}

std::shared_ptr<const JsonSchema> JsonSchema::choices(const std::vector<std::string>& texts, const std::string& name) {
  if (texts.empty()) throw core::ConfigError(name + " must be a non-empty list of texts");
  std::vector<std::string> sorted = texts;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  if (sorted.front().empty()) throw core::ConfigError(name + ": a choice is empty");
  // Sorted, a text that begins another comes right before one it begins.
  for (size_t i = 0; i + 1 < sorted.size(); ++i)
    if (sorted[i + 1].compare(0, sorted[i].size(), sorted[i]) == 0)
      throw core::ConfigError(name + ": \"" + sorted[i] + "\" begins \"" + sorted[i + 1] +
                              "\" (after it the text could neither end nor go on by itself)");
  std::shared_ptr<JsonSchema> s(new JsonSchema());
  s->text_ = name + ":" + ojson(sorted).dump(-1, ' ', false, ojson::error_handler_t::replace);
  auto n = std::make_unique<Node>();
  n->literals = std::move(sorted);
  n->raw = true;
  for (const std::string& t : n->literals) n->first.set(static_cast<unsigned char>(t[0]));
  s->root_ = n.get();
  s->nodes_.push_back(std::move(n));
  return s;
}

const JsonSchema& JsonSchema::any_object() {
  static const std::shared_ptr<const JsonSchema> any = compile(ojson{{"type", "object"}});
  return *any;
}

}  // namespace brisk::infer
