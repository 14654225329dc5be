#include "core/traces/python_repr.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <system_error>
#include <utility>
#include <vector>

#include "core/traces/json_text.h"

namespace torchmem {

namespace {

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

void append_hex(std::string& out, char prefix, char32_t c, int digits) {
  static const char kHex[] = "0123456789abcdef";
  out.push_back('\\');
  out.push_back(prefix);
  for (int shift = 4 * (digits - 1); shift >= 0; shift -= 4) out.push_back(kHex[(c >> shift) & 0xF]);
}

// str.isprintable() for one character, exact up to U+00FF (see the header).
bool is_printable(char32_t c) {
  if (c < 0x100) return (c >= 0x20 && c < 0x7F) || (c > 0xA0 && c != 0xAD);
  return !(c >= 0xD800 && c <= 0xDFFF);
}

// Whether the value's magnitude is at least 1, for numbers too large or too
// small for a double (from_chars reports both as out of range).
bool is_huge(const char* begin, const char* end) {
  const char* p = begin + (*begin == '-');
  long order = 0;  // decimal exponent of the leading digit, less the written exponent
  if (*p != '0') {
    while (p < end && *p >= '0' && *p <= '9') ++p, ++order;
    --order;
  } else {
    p += 2;  // "0."
    order = -1;
    while (p < end && *p == '0') ++p, --order;
  }
  const char* e = static_cast<const char*>(std::memchr(begin, 'e', end - begin));
  if (!e) e = static_cast<const char*>(std::memchr(begin, 'E', end - begin));
  long exponent = 0;
  if (e) {
    const char* q = e + 1;
    const bool negative = *q == '-';
    if (*q == '-' || *q == '+') ++q;
    for (; q < end && exponent < 100000000; ++q) exponent = exponent * 10 + (*q - '0');
    if (negative) exponent = -exponent;
  }
  return order + exponent > 0;
}

// repr() of a finite double: shortest round-trip digits, positional from
// 1e-4 up to 1e16, scientific outside, as float.__repr__.
std::string float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  char buffer[64];
  const auto written = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific).ptr;
  const char* e = static_cast<const char*>(std::memchr(buffer, 'e', written - buffer));
  std::string out;
  const char* p = buffer;
  if (*p == '-') out.push_back(*p++);
  std::string digits;
  for (; p < e; ++p) {
    if (*p != '.') digits.push_back(*p);
  }
  int exponent = 0;
  std::from_chars(e + 1 + (e[1] == '+'), written, exponent);
  const int point = exponent + 1;  // digits are 0.DIGITS x 10**point
  if (point <= -4 || point > 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += exponent < 0 ? "e-" : "e+";
    const std::string magnitude = std::to_string(exponent < 0 ? -exponent : exponent);
    out += (magnitude.size() < 2 ? "0" : "") + magnitude;
  } else if (point <= 0) {
    out += "0." + std::string(-point, '0') + digits;
  } else if (static_cast<size_t>(point) >= digits.size()) {
    out += digits + std::string(point - digits.size(), '0') + ".0";
  } else {
    out += digits.substr(0, point) + "." + digits.substr(point);
  }
  return out;
}

std::string number_repr(const char* begin, const char* end, json::Kind kind) {
  const std::string text(begin, end);
  if (text == "NaN") return "nan";
  if (text == "Infinity") return "inf";
  if (text == "-Infinity") return "-inf";
  if (kind == json::Kind::kInteger) return text == "-0" ? "0" : text;
  double value = 0;
  if (std::from_chars(begin, end, value).ec == std::errc::result_out_of_range) {
    const bool negative = *begin == '-';
    value = is_huge(begin, end) ? HUGE_VAL : 0.0;
    if (negative) value = -value;
  }
  return float_repr(value);
}

std::string array_repr(const char* p, const char* end) {
  std::string out = "[";
  p = json::skip_whitespace(p + 1, end);
  while (*p != ']') {
    json::Kind kind;
    const char* value_end = json::scan_value(p, end, 0, &kind);
    if (out.size() > 1) out += ", ";
    out += python_repr(p, value_end);
    p = json::skip_whitespace(value_end, end);
    if (*p == ',') p = json::skip_whitespace(p + 1, end);
  }
  return out + "]";
}

std::string object_repr(const char* p, const char* end) {
  std::vector<std::pair<std::u32string, std::string>> items;  // in first-seen order
  json::scan_object(p + 1, end, 0, [&](const json::Member& member) {
    std::u32string key = json::decode_string(member.key);
    std::string value = python_repr(member.value_begin, member.value_end);
    for (auto& item : items) {
      if (item.first == key) {
        item.second = std::move(value);
        return;
      }
    }
    items.emplace_back(std::move(key), std::move(value));
  });
  std::string out = "{";
  for (const auto& [key, value] : items) {
    if (out.size() > 1) out += ", ";
    out += python_str_repr(key) + ": " + value;
  }
  return out + "}";
}

}  // namespace

std::string python_str_repr(const std::u32string& text) {
  const bool single = text.find(U'\'') != std::u32string::npos;
  const bool double_ = text.find(U'"') != std::u32string::npos;
  const char quote = single && !double_ ? '"' : '\'';
  std::string out(1, quote);
  for (const char32_t c : text) {
    if (c == static_cast<char32_t>(quote) || c == U'\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == U'\t') {
      out += "\\t";
    } else if (c == U'\n') {
      out += "\\n";
    } else if (c == U'\r') {
      out += "\\r";
    } else if (is_printable(c)) {
      append_utf8(out, c);
    } else if (c <= 0xFF) {
      append_hex(out, 'x', c, 2);
    } else if (c <= 0xFFFF) {
      append_hex(out, 'u', c, 4);
    } else {
      append_hex(out, 'U', c, 8);
    }
  }
  out.push_back(quote);
  return out;
}

std::string python_repr(const char* begin, const char* end) {
  json::Kind kind;
  const char* value_end = json::scan_value(begin, end, 0, &kind);
  switch (kind) {
    case json::Kind::kString: {
      json::StringText text;
      json::scan_string(begin + 1, value_end, &text);
      return python_str_repr(json::decode_string(text));
    }
    case json::Kind::kObject: return object_repr(begin, value_end);
    case json::Kind::kArray: return array_repr(begin, value_end);
    case json::Kind::kTrue: return "True";
    case json::Kind::kFalse: return "False";
    case json::Kind::kNull: return "None";
    case json::Kind::kInteger:
    case json::Kind::kFloat: return number_repr(begin, value_end, kind);
  }
  return "";
}

std::string first_characters(const std::string& text, size_t count) {
  size_t i = 0;
  for (; i < text.size() && count > 0; --count) {
    ++i;
    while (i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) ++i;
  }
  return text.substr(0, i);
}

}  // namespace torchmem
