// Schema-constrained JSON (infer::JsonSchema + JsonConstraint): what the
// compiler refuses and how it names it, texts each schema accepts and
// refuses, and random walks whose closed texts a validator written here
// from the schema's JSON (not from the compiled nodes) accepts, with no
// walk ever left without a byte to go on. tests/serve/check_json_schema.py
// checks generated texts with the jsonschema package as well.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "brisk/core/error.h"
#include "brisk/infer/json_constraint.h"
#include "json_mask_check.h"
#include "brisk/infer/json_schema.h"

namespace brisk {
namespace {

using ojson = nlohmann::ordered_json;

std::shared_ptr<const infer::JsonSchema> compile(const std::string& text) {
  return infer::JsonSchema::compile_text(text);
}

bool complete(const infer::JsonSchema& schema, const std::string& text) {
  infer::JsonConstraint j(schema);
  return j.feed(text) && j.done();
}

// A validator for the supported keywords, straight from JSON Schema's text.
size_t characters(const std::string& s) {
  size_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

bool valid(const ojson& v, const ojson& s, const ojson& doc) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref")) return valid(v, doc.at(ojson::json_pointer(s["$ref"].get<std::string>().substr(1))), doc);
  if (s.contains("allOf")) return valid(v, s["allOf"][0], doc);
  for (const char* key : {"anyOf", "oneOf"})
    if (s.contains(key)) {
      int matches = 0;
      for (const ojson& alt : s[key]) matches += valid(v, alt, doc);
      return std::string(key) == "anyOf" ? matches > 0 : matches == 1;
    }
  if (s.contains("type")) {
    std::vector<ojson> types;
    if (s["type"].is_array()) types.assign(s["type"].begin(), s["type"].end());
    else types.push_back(s["type"]);
    bool any = false;
    for (const ojson& t : types) {
      const std::string name = t.get<std::string>();
      any = any || (name == "object" && v.is_object()) || (name == "array" && v.is_array()) ||
            (name == "string" && v.is_string()) || (name == "number" && v.is_number()) ||
            // (a number past int64 is parsed as a double: integral still)
            (name == "integer" && v.is_number() && std::floor(v.get<double>()) == v.get<double>()) || (name == "boolean" && v.is_boolean()) ||
            (name == "null" && v.is_null());
    }
    if (!any) return false;
  }
  if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end()) return false;
  if (s.contains("const") && v != s["const"]) return false;
  if (v.is_string()) {
    const size_t n = characters(v.get<std::string>());
    if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return false;
    if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return false;
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
    for (const ojson& item : v)
      if (s.contains("items") && !valid(item, s["items"], doc)) return false;
  }
  if (v.is_object()) {
    if (s.contains("required"))
      for (const ojson& r : s["required"])
        if (!v.contains(r.get<std::string>())) return false;
    for (const auto& [key, value] : v.items()) {
      if (s.contains("properties") && s["properties"].contains(key)) {
        if (!valid(value, s["properties"][key], doc)) return false;
      } else if (s.contains("additionalProperties") && !valid(value, s["additionalProperties"], doc)) {
        return false;
      }
    }
  }
  return true;
}

TEST(JsonSchema, RefusesWhatItCannotEnforceByName) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type":"object","properties":{"age":{"type":"integer","minimum":0}}})",
       "schema.properties.age: 'minimum' is not supported"},
      {R"({"type":"object","properties":{"s":{"type":"string","pattern":"^a"}}})", "'pattern' is not supported"},
      {R"({"type":"array","uniqueItems":true})", "'uniqueItems' is not supported"},
      {R"({"type":"array","items":[{"type":"string"}]})", "tuple validation"},
      {R"({"type":"string"})", "the root must allow an object or an array"},
      {R"({"enum":[1,2]})", "the root must allow an object or an array"},
      {R"({"type":"object","properties":{"v":{"anyOf":[{"type":"string"},{"enum":["a",1]}]}}})",
       "may begin with the same byte ('\"')"},
      {R"({"$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}}})", "leads back to itself"},
      {R"({"$defs":{"n":{"type":"object","properties":{"next":{"$ref":"#/$defs/n"}},"required":["next"]}},"$ref":"#/$defs/n"})",
       "has no finite value"},
      {R"({"type":"object","required":["x"]})", "'required' names \"x\", which is not in 'properties'"},
      {R"({"type":"object","properties":{"x":false}})", "schema.properties.x: the schema false allows no value"},
      {R"({"type":"objekt"})", "'type' \"objekt\" is not a JSON type"},
      {R"({"type":"object","properties":{"c":{"type":"string","enum":[1,2]}}})", "holds no value of the schema's 'type'"},
      {R"({"type":"object","properties":{"s":{"type":"string","minLength":3,"maxLength":2}}})",
       "'minLength' is above 'maxLength'"},
      {R"({"type":"array","minItems":-1})", "'minItems' must be a non-negative integer"},
      {R"({"type":"object","properties":{"r":{"$ref":"https://example.com/s.json"}}})", "only references inside"},
      {R"({"type":"object","properties":{"r":{"$ref":"#/$defs/missing"}}})", "points at nothing"},
      {R"({"type":"object","properties":{"r":{"$ref":"#/$defs/a","type":"string"}},"$defs":{"a":{}}})",
       "'$ref' beside 'type' is not supported"},
      {R"({"allOf":[{"type":"object"},{"required":[]}]})", "'allOf' is supported with one schema only"},
      {"[1, 2]", "a schema must be an object or a boolean"},
      {R"({"type":"array","items":{"oneOf":[{"const":0},{"const":-0.0}]}})", "both match 0"},
      {R"({"type":"array","items":{"const":123456789012345678901234567890}})", "cannot be written exactly"},
      {R"({"type":"object","properties":{"a":{"oneOf":[{"anyOf":[{"const":0}]},{"const":-0.0}]}}})", "both match 0"},
      // A $ref's target is named under the schema's own name.
      {R"({"type":"object","properties":{"a":{"$ref":"#/$defs/x"}},"$defs":{"x":{"type":"integer","minimum":1}}})",
       "schema.$defs.x: 'minimum' is not supported"},
      {R"({"type":"object","properties":{"a":{"$ref":"#/$defs/x"}},"$defs":{"x":{"$ref":"#/$defs/x"}}})",
       "schema.properties.a: '$ref' leads back to itself"},
      {"{\"type\":", "schema: not JSON"},
  };
  for (const auto& [schema, message] : cases) {
    try {
      compile(schema);
      ADD_FAILURE() << "compiled: " << schema;
    } catch (const core::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << schema << "\n  said: " << e.what();
    }
  }
  std::string deep = "true";
  for (int i = 0; i < 100; ++i) deep = R"({"type":"array","items":)" + deep + "}";
  EXPECT_THROW(compile(deep), core::ConfigError);
  // An annotation nested 100,000 deep: refused before anything recurses
  // over it (dump() overflowed the stack).
  const std::string nested = R"({"type":"object","description":)" + std::string(100000, '[') +
                             std::string(100000, ']') + "}";
  try {
    compile(nested);
    ADD_FAILURE() << "compiled a schema nested 100,000 deep";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("nests deeper than 256"), std::string::npos) << e.what();
  }
}

// The automaton never reaches a point where no byte goes on: a key, item or
// value whose fewest containers would pass the 64 open at once is refused
// before it starts, and a schema whose every instance nests deeper is.
TEST(JsonSchema, TheDepthLimitLeavesNoDeadEnd) {
  const auto s = compile(R"({"type":"object","additionalProperties":{"$ref":"#"}})");
  infer::JsonConstraint j(*s);
  std::string text;
  for (size_t i = 0; i + 1 < infer::JsonConstraint::kMaxDepth; ++i) text += R"({"":)";
  ASSERT_TRUE(j.feed(text + "{"));  // the 64th object
  EXPECT_FALSE(j.accepts("\"")) << "a key whose value (an object) could not open";
  EXPECT_TRUE(j.accepts("}"));
  std::string closes(infer::JsonConstraint::kMaxDepth, '}');
  EXPECT_TRUE(j.feed(closes));
  EXPECT_TRUE(j.done());

  std::string d = R"({"type":"integer"})";
  for (int i = 0; i < 35; ++i) d = R"({"type":"array","minItems":1,"items":)" + d + "}";
  std::string b = R"({"$ref":"#/$defs/d"})";
  for (int i = 0; i < 35; ++i) b = R"({"type":"array","minItems":1,"items":)" + b + "}";
  try {
    compile(R"({"$defs":{"d":)" + d + R"(},"type":"object","properties":{"a":{"$ref":"#/$defs/d"},"b":)" + b +
            R"(},"required":["a","b"]})");
    ADD_FAILURE() << "compiled a schema whose instances nest 71 deep";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("nests more than 64 containers"), std::string::npos) << e.what();
  }
  // Optional, it is left out where it does not fit.
  const auto optional = compile(R"({"$defs":{"d":)" + d + R"(},"type":"object","properties":{"a":{"$ref":"#/$defs/d"},)"
                                R"("b":)" + b + "}}");
  infer::JsonConstraint o(*optional);
  EXPECT_TRUE(o.feed(R"({"a":)" + std::string(35, '[') + "1" + std::string(35, ']')));
  EXPECT_FALSE(o.accepts(",")) << "b's 70 containers cannot open inside the object";
  EXPECT_TRUE(o.accepts("}"));
}

TEST(JsonSchema, KeysComeInTheSchemasOrderTheRequiredOnesAlways) {
  const auto s = compile(R"({"type":"object","properties":{"b":{"type":"string"},"a":{"type":"integer"},
      "c":{"type":"boolean"}},"required":["a"],"additionalProperties":false})");
  for (const std::string ok : {R"({"b":"x","a":1,"c":true})", R"({"a":1})", R"({"b":"x","a":-20})",
                               R"({ "a" : 0 , "c" : false })", R"({"a":1,"c":true})"})
    EXPECT_TRUE(complete(*s, ok)) << ok;
  for (const std::string bad : {R"({})", R"({"b":"x"})", R"({"a":1,"b":"x"})", R"({"c":true,"a":1})",
                                R"({"a":1,"a":2})", R"({"a":1.5})", R"({"a":1e3})", R"({"d":1,"a":1})",
                                R"({"a":1,})", R"({"a":"1"})", R"({"b":"x","c":true})", R"([1])"})
    EXPECT_FALSE(complete(*s, bad)) << bad;
  // Names are matched as their JSON text: quotes and escapes included.
  const auto q = compile(R"({"type":"object","properties":{"a\"b":{"type":"null"},"a":{"type":"null"}}})");
  EXPECT_TRUE(complete(*q, R"({"a\"b":null,"a":null})"));
  EXPECT_TRUE(complete(*q, R"({"a":null})"));
  EXPECT_FALSE(complete(*q, R"({"a\u0022b":null})"));
}

TEST(JsonSchema, EnumsConstsArraysStringsAndAlternatives) {
  const auto e = compile(R"({"type":"object","properties":{"c":{"enum":["red","green",1,12,null,{"k":[1]}]},
      "k":{"const":"fixed"}},"required":["c"]})");
  for (const std::string ok : {R"({"c":"red"})", R"({"c":12})", R"({"c":1})", R"({"c": 1 })", R"({"c":null})",
                               R"({"c":{"k":[1]}})", R"({"c":"green","k":"fixed"})"})
    EXPECT_TRUE(complete(*e, ok)) << ok;
  for (const std::string bad : {R"({"c":"blue"})", R"({"c":123})", R"({"c":"re"})", R"({"c":2})",
                                R"({"c":{"k": [1]}})", R"({"c":1,"k":"fixe"})", R"({"c":nul})"})
    EXPECT_FALSE(complete(*e, bad)) << bad;

  const auto a = compile(R"({"type":"array","items":{"type":"boolean"},"minItems":1,"maxItems":2})");
  for (const std::string ok : {"[true]", "[true, false]", " [ false ]"}) EXPECT_TRUE(complete(*a, ok)) << ok;
  for (const std::string bad : {"[]", "[true,true,true]", "[1]", "{}"}) EXPECT_FALSE(complete(*a, bad)) << bad;

  const auto str = compile(R"({"type":"object","properties":{"s":{"type":"string","minLength":2,"maxLength":3}},
      "required":["s"]})");
  for (const std::string ok : {R"({"s":"ab"})", R"({"s":"a\nb"})", "{\"s\":\"\xC3\xA9\xC3\xA9\"}",
                               R"({"s":"\u00e9\u00e9x"})"})
    EXPECT_TRUE(complete(*str, ok)) << ok;
  for (const std::string bad : {R"({"s":"a"})", R"({"s":"abcd"})", "{\"s\":\"\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\"}",
                                R"({"s":""})"})
    EXPECT_FALSE(complete(*str, bad)) << bad;

  const auto alt = compile(R"({"type":"object","properties":{"v":{"anyOf":[{"type":"string","maxLength":1},
      {"type":"null"},{"type":"array","items":{"type":"integer"}}]},"w":{"type":["number","null"]}}})");
  for (const std::string ok : {R"({"v":"x"})", R"({"v":null})", R"({"v":[1,2]})", R"({"w":null})", R"({"w":-2.5e3})"})
    EXPECT_TRUE(complete(*alt, ok)) << ok;
  for (const std::string bad : {R"({"v":1})", R"({"v":"xy"})", R"({"v":[1.5]})", R"({"w":"1"})", R"({"w":true})"})
    EXPECT_FALSE(complete(*alt, bad)) << bad;

  const auto free = compile(R"({"type":"object","additionalProperties":{"type":"integer"}})");
  EXPECT_TRUE(complete(*free, R"({"x":1,"y":-2})"));
  EXPECT_FALSE(complete(*free, R"({"x":"a"})"));
  const auto none = compile(R"({"type":"object","additionalProperties":false})");
  EXPECT_TRUE(complete(*none, "{}"));
  EXPECT_FALSE(complete(*none, R"({"x":1})"));
  // An untyped root writes objects and arrays only.
  const auto untyped = compile(R"({"items":{"type":"null"}})");
  EXPECT_TRUE(complete(*untyped, "[null]"));
  EXPECT_TRUE(complete(*untyped, R"({"a":[1]})"));
  EXPECT_FALSE(complete(*untyped, "[1]"));
}

// vLLM's guided_choice: the whole text is one of the choices, taken as
// plain text (no JSON, no whitespace around it).
TEST(JsonSchema, GuidedChoiceTextsAreTakenWhole) {
  const auto c = infer::JsonSchema::choices({"positive", "negative", "neutral", "{x}", "positive"});
  for (const std::string ok : {"positive", "negative", "neutral", "{x}"}) EXPECT_TRUE(complete(*c, ok)) << ok;
  for (const std::string bad : {"pos", " positive", "positive ", "Positive", "{x} ", "\"positive\""})
    EXPECT_FALSE(complete(*c, bad)) << bad;
  infer::JsonConstraint j(*c);
  EXPECT_TRUE(j.feed("ne"));
  EXPECT_TRUE(j.accepts("u") && j.accepts("g"));
  EXPECT_FALSE(j.accepts("x"));
  for (const auto& [texts, words] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{}, "non-empty list"}, {{"a", ""}, "a choice is empty"}, {{"yes", "yes!"}, "\"yes\" begins \"yes!\""}}) {
    try {
      infer::JsonSchema::choices(texts);
      ADD_FAILURE() << "accepted " << ::testing::PrintToString(texts);
    } catch (const core::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  }
}

// Pydantic's shape: $defs, $ref, allOf around a $ref, anyOf with null,
// titles and descriptions; and a recursive tree.
const std::vector<std::string> kWalkSchemas = {
    R"({"$defs":{"Color":{"enum":["red","green","blue"],"title":"Color","type":"string"},
        "Item":{"properties":{"name":{"title":"Name","type":"string","maxLength":6},
                "qty":{"title":"Qty","type":"integer"},"color":{"allOf":[{"$ref":"#/$defs/Color"}],"default":"red"}},
                "required":["name","qty"],"title":"Item","type":"object"}},
       "properties":{"items":{"items":{"$ref":"#/$defs/Item"},"title":"Items","type":"array","maxItems":3},
                     "note":{"anyOf":[{"type":"string","maxLength":4},{"type":"null"}],"default":null},
                     "ok":{"type":"boolean"}},
       "required":["items","ok"],"title":"Order","type":"object"})",
    R"({"$defs":{"node":{"type":"object","properties":{"id":{"type":"integer"},
        "kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["id","kids"]}},
       "$ref":"#/$defs/node"})",
    R"({"type":"array","minItems":2,"maxItems":4,"items":{"anyOf":[{"type":"number"},{"const":"x"},
        {"type":"object","additionalProperties":{"type":"string","minLength":1,"maxLength":2}}]}})",
    R"({"type":"object","properties":{"a":{"type":"string","minLength":1,"maxLength":3},"b":{"enum":[1,12,123,"1"]},
        "c":{"type":"array","items":{"type":"boolean"},"minItems":1,"maxItems":2}},"required":["a","b","c"]})",
    R"({"type":"object"})",
};

TEST(JsonSchema, RandomWalksCloseIntoValidInstancesAndNeverStall) {
  const std::string alphabet = "{}[]\":,  -0123456789.eE+tfnrualsxbidqkygeocmwhp\xC3\xA9\\";
  std::mt19937 rng(11);
  for (const std::string& text : kWalkSchemas) {
    const ojson doc = ojson::parse(text);
    const auto schema = infer::JsonSchema::compile(doc);
    int closed = 0;
    for (int walk = 0; walk < 600; ++walk) {
      infer::JsonConstraint j(*schema);
      std::string out;
      for (int step = 0; step < 300 && !j.done(); ++step) {
        std::vector<char> allowed;
        for (int b = 0; b < 256; ++b)  // liveness over every byte, then a draw from the alphabet's
          if (j.accepts(std::string(1, char(b))) && alphabet.find(char(b)) != std::string::npos)
            allowed.push_back(char(b));
        bool any = !allowed.empty();
        for (int b = 0; b < 256 && !any; ++b) any = j.accepts(std::string(1, char(b)));
        ASSERT_TRUE(any) << "stuck after: " << out << "\nschema: " << text;
        if (allowed.empty()) break;  // only bytes outside the alphabet go on
        for (char c : {'}', ']', '"'})
          if (j.accepts(std::string(1, c))) allowed.push_back(c), allowed.push_back(c);
        const char c = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
        ASSERT_TRUE(j.feed(std::string(1, c)));
        out += c;
      }
      if (!j.done()) continue;
      ++closed;
      ASSERT_TRUE(ojson::accept(out)) << out;
      EXPECT_TRUE(valid(ojson::parse(out), doc, doc)) << out << "\nschema: " << text;
      for (int b = 0; b < 256; ++b) ASSERT_FALSE(j.accepts(std::string(1, char(b)))) << "after the close: " << b;
    }
    EXPECT_GT(closed, 60) << "too few walks closed to check much: " << text;
  }
}

// The mask under a schema: maxLength strings and listed keys turn the
// plain-text shortcut off, enums are texts; it must still decide what
// trying every token decides.
TEST(JsonSchema, MaskEqualsTryingEveryToken) {
  std::vector<std::string> tokens = {"", " ", "{", "}", "[", "]", "\"", "\":", "\",", ":", ",", "\"name", "name",
                                     "\"qty\"", "qty", "\":1", "1", "12", "3", "-", ".5", "true", "null", "red",
                                     "\"red\"", "gre", "en\"", "ab", "abcdefg", "\xC3\xA9", "\\n", "\"items\":[",
                                     "\"ok\":", "\"note\":", "x"};
  std::mt19937 rng(5);
  const std::string bytes = "{}[]\":, -0123456789.trueflsnaimqyok";
  for (int i = 0; i < 300; ++i) {
    std::string t;
    for (int k = int(rng() % 4) + 1; k > 0; --k) t += bytes[rng() % bytes.size()];
    tokens.push_back(t);
  }
  const infer::JsonVocabulary vocab(tokens);
  const auto schema = compile(kWalkSchemas[0]);
  int states = 0;
  for (int walk = 0; walk < 150; ++walk) {
    infer::JsonConstraint j(*schema);
    for (int step = 0; step < 60 && !j.done(); ++step) {
      const std::vector<size_t> ok = testing::mask_checked(vocab, tokens, j);
      ASSERT_FALSE(::testing::Test::HasFailure());
      ++states;
      if (ok.empty()) break;  // the vocabulary here lacks what comes next
      ASSERT_TRUE(j.feed(tokens[ok[rng() % ok.size()]]));
    }
  }
  EXPECT_GT(states, 1000);
}

}  // namespace
}  // namespace brisk
