// Fuzz target: the e-mail handling behind `brisk data emails`
// (src/data/emails.cpp): splitting a message into headers and body, the
// ham/spam label of a group name, and the byte tokenizer the records are
// made with. Input: one raw message; its first line doubles as a group name.
#include <cstdint>
#include <string>

#include "brisk/core/error.h"
#include "brisk/data/converters.h"
#include "brisk/data/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace brisk;
  const std::string_view msg = fuzz::as_text(data, size);

  // The body is what follows the first empty line ("\n\n" or "\n\r\n"), or
  // all after a leading "\n" or "\r\n"; a view into the message, never a copy.
  const std::string_view body = data::email_body(msg);
  if (!body.empty()) {
    FUZZ_CHECK(body.data() >= msg.data() && body.data() + body.size() == msg.data() + msg.size());
    const std::string_view head = msg.substr(0, msg.size() - body.size());
    FUZZ_CHECK(head == "\n" || head == "\r\n" || head.ends_with("\n\n") || head.ends_with("\n\r\n"));
  }

  const std::string_view first_line = msg.substr(0, std::min(msg.find('\n'), size_t(64)));
  try {
    const int32_t label = data::email_group_label(std::string(first_line));
    FUZZ_CHECK(label == 0 || label == 1);
  } catch (const core::ConfigError&) {
  }

  const int64_t bad = data::first_invalid_utf8(msg);
  FUZZ_CHECK(bad >= -1 && bad < int64_t(msg.size()));

  static const auto bytes = data::make_byte_tokenizer();
  const std::vector<int32_t> ids = bytes->encode(body);
  FUZZ_CHECK(bytes->decode(ids) == body);
  return 0;
}
