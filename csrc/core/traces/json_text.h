// JSON text read the way CPython's json.loads reads UTF-8 bytes: the same
// texts accepted, the same first error found, and the same message for it
// (JSONDecodeError.msg as CPython 3.11 and 3.12 word it; 3.13 renamed the
// trailing-comma errors, which here stay "Expecting value" and "Expecting
// property name enclosed in double quotes").
//
// The scanners check and skip text in place; they build nothing. Text is
// UTF-8 already checked with is_python_utf8(): the scanners work on bytes,
// which gives json's answers because every byte of a multi-byte character
// is >= 0x80 and so never whitespace, a delimiter or a control character.
//
// Accepted as json does: NaN, Infinity and -Infinity; lone surrogates, as
// \ud800 escapes or as their three-byte encoding (json decodes bytes with
// "surrogatepass"); duplicate keys (the caller decides which wins).
// Unlike json, nesting deeper than kMaxDepth arrays and objects is a
// SyntaxError here, where json raises RecursionError at a depth that
// depends on the caller's stack (about 1,000).
//
// Errors: SyntaxError, whose what() is the message alone (no position).
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace torchmem::json {

constexpr int kMaxDepth = 1000;

class SyntaxError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The Python type json.loads makes of a value (kInteger: int, kFloat: float
// including NaN and the infinities, kTrue/kFalse: bool, kNull: None).
enum class Kind { kString, kInteger, kFloat, kTrue, kFalse, kNull, kArray, kObject };

// A string scanned in place: the bytes between its quotes.
struct StringText {
  const char* begin;
  const char* end;
  bool escaped;  // holds a backslash escape: decode_string() to read it
};

// One member of an object, as scan_object() hands it over.
struct Member {
  StringText key;
  const char* value_begin;
  const char* value_end;
  Kind kind;
};

// Whether bytes.decode("utf-8", "surrogatepass") accepts the text.
bool is_python_utf8(const char* begin, const char* end);

// json's whitespace: space, tab, line feed, carriage return.
inline bool is_whitespace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

inline const char* skip_whitespace(const char* p, const char* end) {
  while (p < end && is_whitespace(*p)) ++p;
  return p;
}

// The string whose opening quote is just before `p`; returns just past its
// closing quote.
const char* scan_string(const char* p, const char* end, StringText* text);

// The value at `p` (not whitespace), inside `depth` arrays and objects;
// returns just past it.
const char* scan_value(const char* p, const char* end, int depth, Kind* kind);

// The string's characters, escapes decoded, as code points (lone
// surrogates kept as they are).
std::u32string decode_string(const StringText& text);

// The object whose '{' is just before `p`, inside `depth` arrays and objects
// counting itself; calls on_member(const Member&) for each member in order
// once its value is scanned. Returns just past the closing '}'.
template <typename OnMember>
const char* scan_object(const char* p, const char* end, int depth, OnMember&& on_member) {
  p = skip_whitespace(p, end);
  if (p < end && *p == '}') return p + 1;
  for (;;) {
    if (p == end || *p != '"') throw SyntaxError("Expecting property name enclosed in double quotes");
    Member member;
    p = skip_whitespace(scan_string(p + 1, end, &member.key), end);
    if (p == end || *p != ':') throw SyntaxError("Expecting ':' delimiter");
    member.value_begin = skip_whitespace(p + 1, end);
    member.value_end = scan_value(member.value_begin, end, depth, &member.kind);
    on_member(static_cast<const Member&>(member));
    p = skip_whitespace(member.value_end, end);
    if (p < end && *p == '}') return p + 1;
    if (p == end || *p != ',') throw SyntaxError("Expecting ',' delimiter");
    p = skip_whitespace(p + 1, end);
  }
}

}  // namespace torchmem::json
