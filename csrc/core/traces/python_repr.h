// Python's repr() of the objects json.loads makes, written from the JSON
// text itself: for error messages that must read exactly as Python's
// ("got 4096.0", "unknown op 'malloc'", "got [1, 2]").
//
// Ints print in full, floats in Python's shortest round-trip form
// (1e+16, 0.0001, inf, nan), strings in Python's quotes and escapes, true,
// false and null as True, False and None, objects as dicts (a repeated key
// keeps its first place and its last value, as in json.loads).
//
// One approximation: Python escapes the characters Unicode calls
// unprintable; this does so exactly up to U+00FF and for lone surrogates,
// and prints every other character as it is.
#pragma once

#include <cstddef>
#include <string>

namespace torchmem {

// repr() of the value whose text is [begin, end): one JSON value that
// json::scan_value accepted. Returns UTF-8.
std::string python_repr(const char* begin, const char* end);

// repr() of a str, from its code points.
std::string python_str_repr(const std::u32string& text);

// The first `count` characters of UTF-8 text, as format(text, f".{count}").
std::string first_characters(const std::string& text, size_t count);

}  // namespace torchmem
