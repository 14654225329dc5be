#include "core/traces/json_text.h"

#include <cstdint>
#include <cstring>

namespace torchmem::json {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The four hex digits at p as a code unit, or -1.
long hex4(const char* p) {
  long value = 0;
  for (int i = 0; i < 4; ++i) {
    const int digit = hex_value(p[i]);
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

bool is_high_surrogate(long c) { return c >= 0xD800 && c <= 0xDBFF; }
bool is_low_surrogate(long c) { return c >= 0xDC00 && c <= 0xDFFF; }

// Length of the UTF-8 sequence at p (surrogates allowed), or 0 if invalid.
size_t utf8_sequence_length(const unsigned char* p, const unsigned char* end) {
  const unsigned char lead = p[0];
  size_t length;
  unsigned char low = 0x80, high = 0xBF;  // bounds of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (static_cast<size_t>(end - p) < length || p[1] < low || p[1] > high) return 0;
  for (size_t i = 2; i < length; ++i) {
    if (!is_continuation(p[i])) return 0;
  }
  return length;
}

char32_t decode_utf8(const unsigned char* p, size_t length) {
  if (length == 1) return p[0];
  char32_t c = p[0] & (0xFF >> (length + 1));
  for (size_t i = 1; i < length; ++i) c = (c << 6) | (p[i] & 0x3F);
  return c;
}

const char* expect_literal(const char* p, const char* end, const char* literal) {
  const size_t n = std::strlen(literal);
  if (static_cast<size_t>(end - p) >= n && std::memcmp(p, literal, n) == 0) return p + n;
  return nullptr;
}

// json's number grammar, with its backtracking: "1." is 1 followed by ".",
// "1e" is 1 followed by "e".
const char* scan_number(const char* p, const char* end, Kind* kind) {
  if (*p == '-' && ++p == end) throw SyntaxError("Expecting value");
  if (*p >= '1' && *p <= '9') {
    while (++p < end && is_digit(*p)) {
    }
  } else if (*p == '0') {
    ++p;
  } else {
    throw SyntaxError("Expecting value");
  }
  *kind = Kind::kInteger;
  if (p + 1 < end && *p == '.' && is_digit(p[1])) {
    *kind = Kind::kFloat;
    p += 2;
    while (p < end && is_digit(*p)) ++p;
  }
  if (p + 1 < end && (*p == 'e' || *p == 'E')) {
    const char* exponent = p++;
    if (p + 1 < end && (*p == '-' || *p == '+')) ++p;
    while (p < end && is_digit(*p)) ++p;
    if (is_digit(p[-1])) {
      *kind = Kind::kFloat;
    } else {
      p = exponent;
    }
  }
  return p;
}

const char* scan_array(const char* p, const char* end, int depth) {
  p = skip_whitespace(p, end);
  if (p < end && *p == ']') return p + 1;
  for (;;) {
    Kind kind;
    p = skip_whitespace(scan_value(p, end, depth, &kind), end);
    if (p < end && *p == ']') return p + 1;
    if (p == end || *p != ',') throw SyntaxError("Expecting ',' delimiter");
    p = skip_whitespace(p + 1, end);
  }
}

int enter(int depth) {
  if (depth >= kMaxDepth) throw SyntaxError("nested deeper than " + std::to_string(kMaxDepth) + " arrays and objects");
  return depth + 1;
}

}  // namespace

bool is_python_utf8(const char* begin, const char* end) {
  auto p = reinterpret_cast<const unsigned char*>(begin);
  const auto stop = reinterpret_cast<const unsigned char*>(end);
  while (p < stop) {
    if (stop - p >= 8) {
      uint64_t word;
      std::memcpy(&word, p, 8);
      if ((word & 0x8080808080808080ull) == 0) {
        p += 8;
        continue;
      }
    }
    if (*p < 0x80) {
      ++p;
      continue;
    }
    const size_t length = utf8_sequence_length(p, stop);
    if (length == 0) return false;
    p += length;
  }
  return true;
}

const char* scan_string(const char* p, const char* end, StringText* text) {
  text->begin = p;
  text->escaped = false;
  for (;;) {
    while (p < end && *p != '"' && *p != '\\') {
      if (static_cast<unsigned char>(*p) <= 0x1F) throw SyntaxError("Invalid control character at");
      ++p;
    }
    if (p == end) throw SyntaxError("Unterminated string starting at");
    if (*p == '"') {
      text->end = p;
      return p + 1;
    }
    text->escaped = true;
    if (++p == end) throw SyntaxError("Unterminated string starting at");
    if (*p != 'u') {
      if (!std::strchr("\"\\/bfnrt", *p) || *p == '\0') throw SyntaxError("Invalid \\escape");
      ++p;
      continue;
    }
    ++p;
    if (end - p <= 4) throw SyntaxError("Invalid \\uXXXX escape");
    const long unit = hex4(p);
    if (unit < 0) throw SyntaxError("Invalid \\uXXXX escape");
    p += 4;
    if (is_high_surrogate(unit) && end - p > 6 && p[0] == '\\' && p[1] == 'u') {
      const long low = hex4(p + 2);
      if (low < 0) throw SyntaxError("Invalid \\uXXXX escape");
      if (is_low_surrogate(low)) p += 6;
    }
  }
}

const char* scan_value(const char* p, const char* end, int depth, Kind* kind) {
  if (p == end) throw SyntaxError("Expecting value");
  const char* after = nullptr;
  switch (*p) {
    case '"': {
      StringText text;
      *kind = Kind::kString;
      return scan_string(p + 1, end, &text);
    }
    case '{':
      *kind = Kind::kObject;
      return scan_object(p + 1, end, enter(depth), [](const Member&) {});
    case '[':
      *kind = Kind::kArray;
      return scan_array(p + 1, end, enter(depth));
    case 'n':
      *kind = Kind::kNull;
      after = expect_literal(p, end, "null");
      break;
    case 't':
      *kind = Kind::kTrue;
      after = expect_literal(p, end, "true");
      break;
    case 'f':
      *kind = Kind::kFalse;
      after = expect_literal(p, end, "false");
      break;
    case 'N':
      *kind = Kind::kFloat;
      after = expect_literal(p, end, "NaN");
      break;
    case 'I':
      *kind = Kind::kFloat;
      after = expect_literal(p, end, "Infinity");
      break;
    case '-':
      *kind = Kind::kFloat;
      after = expect_literal(p, end, "-Infinity");
      break;
    default:
      break;
  }
  return after ? after : scan_number(p, end, kind);
}

std::u32string decode_string(const StringText& text) {
  std::u32string out;
  auto p = reinterpret_cast<const unsigned char*>(text.begin);
  const auto end = reinterpret_cast<const unsigned char*>(text.end);
  while (p < end) {
    if (*p != '\\') {
      const size_t length = *p < 0x80 ? 1 : utf8_sequence_length(p, end);
      out.push_back(decode_utf8(p, length));
      p += length;
      continue;
    }
    const char escape = static_cast<char>(p[1]);
    p += 2;
    switch (escape) {
      case 'b': out.push_back(U'\b'); continue;
      case 'f': out.push_back(U'\f'); continue;
      case 'n': out.push_back(U'\n'); continue;
      case 'r': out.push_back(U'\r'); continue;
      case 't': out.push_back(U'\t'); continue;
      case 'u': break;
      default: out.push_back(static_cast<char32_t>(escape)); continue;
    }
    long unit = hex4(reinterpret_cast<const char*>(p));
    p += 4;
    if (is_high_surrogate(unit) && end - p >= 6 && p[0] == '\\' && p[1] == 'u') {
      const long low = hex4(reinterpret_cast<const char*>(p + 2));
      if (is_low_surrogate(low)) {
        unit = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
        p += 6;
      }
    }
    out.push_back(static_cast<char32_t>(unit));
  }
  return out;
}

}  // namespace torchmem::json
