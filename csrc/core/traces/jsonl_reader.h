// JsonlReader: a streaming reader of JSON-lines allocation traces, one event
// per line:
//
//   {"op": "alloc", "id": 7, "size": 4096, "stream": 0}
//   {"op": "free", "id": 7}
//
// It reads the file in large buffers (one line may span buffers; a line
// longer than the buffer grows it) and appends events to caller-provided
// columns, up to a given number per call, so a trace of any length is read
// in bounded memory.
//
// What is accepted is exactly what torchmem's Python reader accepted
// (json.loads of each line, then traces._parse_event), with the same error
// messages:
// - Lines end at "\n"; a "\r" before it is whitespace. Lines of only
//   spaces, tabs, "\r", "\v" or "\f" are skipped (and counted). The last
//   line needs no "\n". A line may start with a UTF-8 byte-order mark.
// - Each other line is one JSON object (json_text.h: json.loads' grammar,
//   NaN and Infinity included). Keys may be written with escapes; a key
//   given twice takes its last value. Keys other than op, id, size and
//   stream are checked as JSON and skipped, whatever their values.
// - "op" is "alloc" or "free"; "id" is required; "size" and "stream"
//   default to 0. id, size and stream are JSON integers (not 4096.0, 1e3,
//   true or NaN) from 0 to 2**64 - 1 ("-0" is 0). An alloc needs size > 0.
//   A free keeps the size it gives.
//
// Errors: read() throws std::invalid_argument naming the line:
//   "line 3: not UTF-8 text"
//   "line 3: not JSON (Expecting ',' delimiter); truncated file?"
//   "line 3: expected an object like {...}, got [1, 2]"
//   "line 3: unknown op 'malloc' (expected 'alloc' or 'free')"
//   "line 3: bad or missing field ('id')"
//   "line 3: size must be an integer, got 4096.0"
//   "line 3: id, size and stream must be below 2**64"
//   "line 3: id, size and stream must be non-negative"
//   "line 3: alloc of 0 bytes"
// The columns then hold the events of the lines before the bad one, and
// every later read() throws the same error. With skip_bad_lines, a bad line
// (any of the errors above) is skipped instead: counted in skipped_lines(),
// the first one's message kept in first_skipped(), and reading goes on. The constructor and read()
// throw std::system_error (with errno) when the file cannot be opened or
// read.
//
// Where this differs from json.loads (never on a line json.loads reads as
// UTF-8 JSON): nesting deeper than 1,000 arrays and objects is "not JSON
// (nested deeper than 1000 arrays and objects)" (json raises RecursionError
// near there); integers of over 4,300 digits are read (json raises
// ValueError); a line starting with a UTF-16 or UTF-32 byte-order mark, or
// with a NUL in its first two bytes, is read as UTF-8 (json would try
// UTF-16 or UTF-32); and values quoted in messages escape unprintable
// characters exactly only up to U+00FF (python_repr.h).
//
// Ownership: the reader owns the file (closed at end of file or on
// destruction) and its buffer; the columns belong to the caller.
// Not thread safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace torchmem {

// Event columns, one entry per event. ops: 0 alloc, 1 free (ReplayOp).
struct EventColumns {
  std::vector<uint8_t> ops;
  std::vector<uint64_t> ids;
  std::vector<uint64_t> sizes;
  std::vector<uint64_t> streams;

  size_t size() const { return ops.size(); }
};

class JsonlReader {
 public:
  static constexpr size_t kDefaultBufferBytes = size_t{1} << 20;

  explicit JsonlReader(const std::string& path, size_t buffer_bytes = kDefaultBufferBytes, bool skip_bad_lines = false);
  ~JsonlReader();
  JsonlReader(const JsonlReader&) = delete;
  JsonlReader& operator=(const JsonlReader&) = delete;

  // Appends the next events, at most max_events of them, to `columns`;
  // returns how many. 0 means the end of the file (or max_events == 0).
  size_t read(size_t max_events, EventColumns& columns);

  // Lines read so far, blank ones included.
  uint64_t lines() const { return lines_; }
  // With skip_bad_lines: the bad lines skipped so far, and the first one's error ("line 3: ...").
  uint64_t skipped_lines() const { return skipped_; }
  const std::string& first_skipped() const { return first_skipped_; }

 private:
  // The next line, "\n" included when present; false at the end of the file.
  bool next_line(const char** begin, const char** end);
  void refill();
  void close();

  std::string path_;
  std::FILE* file_ = nullptr;
  std::vector<char> buffer_;
  size_t start_ = 0;      // first unread byte in buffer_
  size_t filled_ = 0;     // bytes of buffer_ holding file data
  size_t searched_ = 0;   // bytes from start_ known to hold no "\n"
  bool at_eof_ = false;
  uint64_t lines_ = 0;
  std::string error_;     // set once a line is bad (not with skip_bad_)
  bool skip_bad_ = false;
  uint64_t skipped_ = 0;
  std::string first_skipped_;
};

}  // namespace torchmem
