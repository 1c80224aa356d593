// The UTF-8 lead-byte table (RFC 3629), shared by the code that walks
// UTF-8 a byte at a time: the server's text stream and the JSON automaton.
#pragma once

namespace brisk::core {

// What a character that starts with byte `lead` continues with: how many
// continuation bytes (-1: `lead` starts no character; 0: ASCII), and the
// range the first of them must lie in (narrower than 0x80-0xBF where a
// wider one would allow an overlong form, a surrogate or a code point past
// U+10FFFF); every later one is 0x80-0xBF.
struct Utf8Lead {
  int continuation = -1;
  unsigned char lo = 0x80, hi = 0xBF;
};

constexpr Utf8Lead utf8_lead(unsigned char c) {
  if (c < 0x80) return {0};
  if (c >= 0xC2 && c <= 0xDF) return {1};
  if (c == 0xE0) return {2, 0xA0, 0xBF};
  if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) return {2};
  if (c == 0xED) return {2, 0x80, 0x9F};  // no surrogates
  if (c == 0xF0) return {3, 0x90, 0xBF};
  if (c >= 0xF1 && c <= 0xF3) return {3};
  if (c == 0xF4) return {3, 0x80, 0x8F};  // nothing past U+10FFFF
  return {};
}

}  // namespace brisk::core
