// Shared TOML config plumbing (toml_config.h).
#include "toml_config.h"

#include <sstream>

#include "brisk/data/tokenizer.h"

namespace brisk::train::detail {

std::string model_kind_of(const std::string& path, const std::vector<std::string>& overrides) {
  if (path.empty()) return "";
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error&) {
    return "";
  }
  for (const std::string& o : overrides)
    if (o.rfind("model.kind=", 0) == 0) apply_override(root, o);
  const toml::node* kind = root.at_path("model.kind").node();
  return kind && kind->is_string() ? kind->value<std::string>().value() : "";
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

void check_known(const toml::table& root, const KnownKeys& kKnownKeys) {
  std::vector<std::string> sections;
  for (const auto& [k, v] : kKnownKeys) sections.push_back(k);
  for (const auto& [section, node] : root) {
    const std::string name(section.str());
    auto it = kKnownKeys.find(name);
    if (it == kKnownKeys.end())
      throw ConfigError("config: unknown section [" + name + "] (allowed: " + join(sections) + ")");
    const toml::table* t = node.as_table();
    if (!t) throw ConfigError("config: '" + name + "' must be a section ([" + name + "])");
    for (const auto& [key, value] : *t) {
      const std::string k(key.str());
      if (std::find(it->second.begin(), it->second.end(), k) == it->second.end())
        throw ConfigError("config: unknown key '" + name + "." + k + "' (allowed in [" + name + "]: " +
                          join(it->second) + ")");
    }
  }
}

void apply_override(toml::table& root, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError("--set '" + assignment + "': expected section.key=value, e.g. train.steps=100");
  const std::string path = assignment.substr(0, eq), value = assignment.substr(eq + 1);
  const auto dot = path.find('.');
  if (dot == std::string::npos)
    throw ConfigError("--set '" + assignment + "': the key must name its section, e.g. train." + path);
  const std::string section = path.substr(0, dot), key = path.substr(dot + 1);
  // A value is parsed as TOML (numbers, booleans, quoted strings); anything
  // that does not parse is taken as a bare string (a path, a preset name).
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    // TOML text is UTF-8: a value that is not could not be written back to
    // the run's config.toml (to_toml) as a config that loads.
    if (const int64_t bad = data::first_invalid_utf8(value); bad >= 0)
      throw ConfigError("--set '" + assignment + "': the value is not valid UTF-8 (at byte " + std::to_string(bad) +
                        ")");
    parsed.insert_or_assign("v", value);
  }
  if (!root.contains(section)) root.insert(section, toml::table{});
  toml::table* t = root[section].as_table();
  if (!t) throw ConfigError("--set '" + assignment + "': '" + section + "' is not a section");
  t->insert_or_assign(key, *parsed["v"].node());
}

// A TOML syntax error as name:line:column: what is wrong.
ConfigError toml_error(const std::string& name, const toml::parse_error& e) {
  std::ostringstream msg;
  msg << name << ":" << e.source().begin.line << ":" << e.source().begin.column << ": " << e.description();
  return ConfigError(msg.str());
}


// A value error with the file it came from in front ("run.toml: train.batch
// must be an integer"): the key names the field, the prefix the file (and
// that --set may have put the value there).
ConfigError in_file(const std::string& name, bool overridden, const ConfigError& e) {
  std::string what = e.what();
  if (name.empty()) return e;
  if (what.rfind("config: ", 0) == 0) what.erase(0, 8);
  return ConfigError(name + (overridden ? " (with --set overrides)" : "") + ": " + what);
}


}  // namespace brisk::train::detail
