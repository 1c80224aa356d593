// Typed errors. User-facing failures (bad shapes, configs, files, requests)
// throw one of these with a message that says what was wrong and what was
// expected; nothing in brisk aborts the process on user input.
#pragma once

#include <stdexcept>
#include <string>

namespace brisk::core {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An op got inputs whose shapes do not fit together.
class ShapeError : public Error {
 public:
  using Error::Error;
};

// An op got an element type it does not accept.
class DTypeError : public Error {
 public:
  using Error::Error;
};

// A configuration value is missing or out of range.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A file is missing, truncated or not what it claims to be.
class IoError : public Error {
 public:
  using Error::Error;
};

// A backend cannot run what was asked (no kernel, no device).
class BackendError : public Error {
 public:
  using Error::Error;
};

}  // namespace brisk::core
