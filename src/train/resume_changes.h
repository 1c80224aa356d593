// What a resumed run changes of the run it continues. A resume takes its
// settings from the config it is given (docs/formats.md, Resuming exactly),
// so a changed lr, step count or batch silently makes another run than the
// one stopped; this names such changes in the log. Internal to src/train.
#pragma once

#include <string>
#include <vector>

namespace brisk::train::detail {

// The settings of `old_toml` (a run directory's config.toml) that `new_toml`
// (to_toml of this run's config) changes, as "train.lr 0.001 -> 0.002"; a
// key only one of them has is "(none)" on the other side, except that a key
// `old_toml` lacks but `defaults_toml` (to_toml of a default config) has
// counts as that default: a run written before the key existed ran with it.
// Keys that do not shape the updates (threads, loader workers, logging,
// checkpointing, the cache size) are left out.
std::vector<std::string> changed_settings(const std::string& old_toml, const std::string& new_toml,
                                          const std::string& defaults_toml = "");

// "resume: settings changed since the stopped run (<dir>/config.toml): a, b;
// the run continues with the new values", or "" when nothing changed or the
// directory has no readable config.toml.
std::string changed_settings_line(const std::string& run_dir, const std::string& new_toml,
                                  const std::string& defaults_toml);

}  // namespace brisk::train::detail
