#include "core/traces/jsonl_reader.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>

#include "core/traces/json_text.h"
#include "core/traces/python_repr.h"

namespace torchmem {

namespace {

constexpr uint8_t kAlloc = 0;
constexpr uint8_t kFree = 1;
constexpr size_t kMaxReserve = size_t{1} << 16;  // events reserved ahead per read()

struct Event {
  uint8_t op;
  uint64_t id;
  uint64_t size;
  uint64_t stream;
};

// The text of one of the event's fields, as the last mention of its key gave it.
struct Field {
  const char* begin = nullptr;  // nullptr: absent
  const char* end = nullptr;
  json::Kind kind = json::Kind::kNull;

  bool present() const { return begin != nullptr; }
  std::string repr() const { return present() ? python_repr(begin, end) : "None"; }
};

struct EventFields {
  Field op, id, size, stream;
};

// A JSON integer read into 64 bits: as Python compares it with 0 and 2**64.
struct Integer {
  uint64_t value = 0;
  bool negative = false;  // below 0 ("-0" is not)
  bool too_big = false;   // magnitude 2**64 or more
};

[[noreturn]] void reject(const std::string& what) { throw std::invalid_argument(what); }

// bytes.strip() leaves nothing.
bool is_blank(const char* p, const char* end) {
  for (; p < end; ++p) {
    if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != '\v' && *p != '\f') return false;
  }
  return true;
}

bool key_is(const json::StringText& key, const char* name) {
  const size_t length = std::strlen(name);
  if (!key.escaped) return static_cast<size_t>(key.end - key.begin) == length && std::memcmp(key.begin, name, length) == 0;
  const std::u32string decoded = json::decode_string(key);
  return std::equal(decoded.begin(), decoded.end(), name, name + length);
}

Field* field_for(const json::StringText& key, EventFields& fields) {
  if (key_is(key, "op")) return &fields.op;
  if (key_is(key, "id")) return &fields.id;
  if (key_is(key, "size")) return &fields.size;
  if (key_is(key, "stream")) return &fields.stream;
  return nullptr;
}

// The line's one value, checked as json.loads checks it. Returns false when
// it is not an object, with `value` spanning it.
bool scan_line(const char* p, const char* end, EventFields& fields, Field& value) {
  static const char kByteOrderMark[] = "\xEF\xBB\xBF";
  if (end - p >= 3 && std::memcmp(p, kByteOrderMark, 3) == 0) p += 3;
  p = json::skip_whitespace(p, end);
  bool is_object = p < end && *p == '{';
  if (is_object) {
    p = json::scan_object(p + 1, end, 1, [&fields](const json::Member& member) {
      if (Field* field = field_for(member.key, fields)) *field = {member.value_begin, member.value_end, member.kind};
    });
  } else {
    value.begin = p;
    p = value.end = json::scan_value(p, end, 0, &value.kind);
  }
  if (json::skip_whitespace(p, end) != end) throw json::SyntaxError("Extra data");
  return is_object;
}

bool is_string(const Field& field, const char* text) {
  if (field.kind != json::Kind::kString) return false;
  const json::StringText body{field.begin + 1, field.end - 1, std::memchr(field.begin, '\\', field.end - field.begin) != nullptr};
  return key_is(body, text);
}

Integer integer_of(const Field& field, const char* name) {
  Integer out;
  if (!field.present()) return out;
  if (field.kind != json::Kind::kInteger) reject(std::string(name) + " must be an integer, got " + field.repr());
  const char* p = field.begin;
  out.negative = *p == '-';
  for (p += out.negative; p < field.end; ++p) {
    const uint64_t digit = static_cast<uint64_t>(*p - '0');
    if (out.value > (UINT64_MAX - digit) / 10) out.too_big = true;
    if (!out.too_big) out.value = out.value * 10 + digit;
  }
  out.negative = out.negative && (out.value != 0 || out.too_big);
  return out;
}

// The event on one line (traces._parse_event's checks, in its order);
// false for a blank line.
bool parse_line(const char* begin, const char* end, Event* event) {
  if (is_blank(begin, end)) return false;
  if (!json::is_python_utf8(begin, end)) reject("not UTF-8 text");
  EventFields fields;
  Field value;
  bool is_object;
  try {
    is_object = scan_line(begin, end, fields, value);
  } catch (const json::SyntaxError& e) {
    reject(std::string("not JSON (") + e.what() + "); truncated file?");
  }
  if (!is_object) {
    reject("expected an object like {\"op\": \"alloc\", \"id\": 1, \"size\": 512}, got " +
           first_characters(value.repr(), 80));
  }
  if (is_string(fields.op, "alloc")) {
    event->op = kAlloc;
  } else if (is_string(fields.op, "free")) {
    event->op = kFree;
  } else {
    reject("unknown op " + fields.op.repr() + " (expected 'alloc' or 'free')");
  }
  if (!fields.id.present()) reject("bad or missing field ('id')");
  const Integer id = integer_of(fields.id, "id");
  const Integer size = integer_of(fields.size, "size");
  const Integer stream = integer_of(fields.stream, "stream");
  if ((id.too_big && !id.negative) || (size.too_big && !size.negative) || (stream.too_big && !stream.negative)) {
    reject("id, size and stream must be below 2**64");
  }
  if (id.negative || size.negative || stream.negative) reject("id, size and stream must be non-negative");
  if (event->op == kAlloc && size.value == 0) reject("alloc of 0 bytes");
  event->id = id.value;
  event->size = size.value;
  event->stream = stream.value;
  return true;
}

}  // namespace

JsonlReader::JsonlReader(const std::string& path, size_t buffer_bytes, bool skip_bad_lines)
    : path_(path), buffer_(std::max<size_t>(buffer_bytes, 1)), skip_bad_(skip_bad_lines) {
  file_ = std::fopen(path.c_str(), "rb");
  if (!file_) throw std::system_error(errno, std::generic_category(), path);
  std::setvbuf(file_, nullptr, _IONBF, 0);  // buffer_ is the only buffer
}

JsonlReader::~JsonlReader() { close(); }

void JsonlReader::close() {
  if (file_) std::fclose(file_);
  file_ = nullptr;
}

size_t JsonlReader::read(size_t max_events, EventColumns& columns) {
  if (!error_.empty()) throw std::invalid_argument(error_);
  const size_t reserve = columns.size() + std::min(max_events, kMaxReserve);
  columns.ops.reserve(reserve);
  columns.ids.reserve(reserve);
  columns.sizes.reserve(reserve);
  columns.streams.reserve(reserve);
  size_t count = 0;
  const char* begin;
  const char* end;
  while (count < max_events && next_line(&begin, &end)) {
    ++lines_;
    Event event;
    try {
      if (!parse_line(begin, end, &event)) continue;
    } catch (const std::invalid_argument& e) {
      std::string what = "line " + std::to_string(lines_) + ": " + e.what();
      if (skip_bad_) {
        if (skipped_++ == 0) first_skipped_ = std::move(what);
        continue;
      }
      error_ = std::move(what);
      throw std::invalid_argument(error_);
    }
    columns.ops.push_back(event.op);
    columns.ids.push_back(event.id);
    columns.sizes.push_back(event.size);
    columns.streams.push_back(event.stream);
    ++count;
  }
  return count;
}

bool JsonlReader::next_line(const char** begin, const char** end) {
  for (;;) {
    char* data = buffer_.data();
    const size_t unread = filled_ - start_;
    const void* newline = std::memchr(data + start_ + searched_, '\n', unread - searched_);
    if (newline || (at_eof_ && unread > 0)) {
      *begin = data + start_;
      *end = newline ? static_cast<const char*>(newline) + 1 : data + filled_;
      start_ = *end - data;
      searched_ = 0;
      return true;
    }
    if (at_eof_) return false;
    searched_ = unread;
    refill();
  }
}

void JsonlReader::refill() {
  const size_t unread = filled_ - start_;
  std::memmove(buffer_.data(), buffer_.data() + start_, unread);
  start_ = 0;
  filled_ = unread;
  if (filled_ == buffer_.size()) buffer_.resize(buffer_.size() * 2);  // one line fills the buffer
  const size_t got = std::fread(buffer_.data() + filled_, 1, buffer_.size() - filled_, file_);
  filled_ += got;
  if (got > 0) return;
  if (std::ferror(file_)) throw std::system_error(errno, std::generic_category(), path_);
  at_eof_ = true;
  close();
}

}  // namespace torchmem
