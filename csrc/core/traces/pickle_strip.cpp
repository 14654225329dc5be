#include "core/traces/pickle_strip.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

namespace torchmem {

namespace {

enum Kind : uint8_t { kMark, kDict, kList, kOther, kKeyString };  // kKeyString: a string equal to the key
constexpr uint8_t kAbsent = 0xff;
constexpr uint8_t kStripped = 0x80;
constexpr size_t kMemoSlack = 1 << 20;  // explicit memo indices may run this far past the memo's size

uint64_t read_le(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

bool is_memo_store(uint8_t op) { return op == 'p' || op == 'q' || op == 'r' || op == 0x94; }
bool is_memo_fetch(uint8_t op) { return op == 'g' || op == 'h' || op == 'j'; }

// One opcode: where it starts and ends, its string (for string opcodes) and its memo index.
struct Op {
  uint8_t code = 0;
  size_t at = 0, end = 0;
  std::string_view str;
  bool is_string = false;
  uint64_t memo_index = 0;
};

// Reads the opcode at `pos` (the stream is known to hold plain opcodes only: scan_plain_pickle).
bool read_op(const uint8_t* p, size_t size, size_t pos, Op& op) {
  op = Op{};
  op.code = p[pos];
  op.at = pos++;
  auto counted = [&](size_t width, bool is_string) {
    if (width > size - pos) return false;
    const uint64_t n = read_le(p + pos, width);
    pos += width;
    if (n > size - pos) return false;
    if (is_string) op.str = std::string_view(reinterpret_cast<const char*>(p) + pos, static_cast<size_t>(n));
    op.is_string = is_string;
    pos += static_cast<size_t>(n);
    return true;
  };
  auto fixed = [&](size_t n) {
    if (n > size - pos) return false;
    if (op.code == 'q' || op.code == 'h' || op.code == 'r' || op.code == 'j') op.memo_index = read_le(p + pos, n);
    pos += n;
    return true;
  };
  bool ok = true;
  switch (op.code) {
    case 'I': case 'L': case 'F': case 'S': case 'V': case 'p': case 'g': {
      const void* nl = std::memchr(p + pos, '\n', size - pos);
      if (nl == nullptr) return false;
      const size_t end = static_cast<const uint8_t*>(nl) - p;
      std::string_view text(reinterpret_cast<const char*>(p) + pos, end - pos);
      if (op.code == 'p' || op.code == 'g') {
        std::string digits(text);
        char* stop = nullptr;
        op.memo_index = std::strtoull(digits.c_str(), &stop, 10);
        if (digits.empty() || *stop != '\0') return false;
      }
      if (op.code == 'S' || op.code == 'V') {
        op.is_string = true;
        op.str = op.code == 'S' && text.size() >= 2 ? text.substr(1, text.size() - 2) : text;
      }
      pos = end + 1;
      break;
    }
    case 0x80: case 'K': case 'q': case 'h': ok = fixed(1); break;
    case 'M': ok = fixed(2); break;
    case 'J': case 'r': case 'j': ok = fixed(4); break;
    case 'G': case 0x95: ok = fixed(8); break;
    case 'U': case 0x8c: ok = counted(1, true); break;
    case 0x8a: case 'C': ok = counted(1, false); break;
    case 'T': case 'X': ok = counted(4, true); break;
    case 0x8b: case 'B': ok = counted(4, false); break;
    case 0x8d: ok = counted(8, true); break;
    case 0x8e: ok = counted(8, false); break;
    default: break;
  }
  op.end = pos;
  return ok;
}

struct Slot {
  Kind kind;
  size_t start;  // where the item began: its first opcode (for a tuple or a list built from a mark, the mark's)
};

// Pass 1: follow the unpickler's stack; each value that a SETITEM or SETITEMS stores in a dict under a
// key equal to `key` is a region [start of the value, start of what follows it in the batch).
class RegionFinder {
 public:
  RegionFinder(const uint8_t* p, size_t size, std::string_view key) : p_(p), size_(size), key_(key) {}

  bool run(std::vector<std::pair<size_t, size_t>>& regions) {
    size_t pos = 0;
    Op op;
    while (pos < size_) {
      if (!read_op(p_, size_, pos, op) || !apply(op, regions)) return false;
      pos = op.end;
      if (op.code == '.') return true;
    }
    return false;
  }

 private:
  bool pop_to_mark(size_t& mark) {
    size_t i = stack_.size();
    while (i > 0 && stack_[i - 1].kind != kMark) --i;
    if (i == 0) return false;
    mark = i - 1;
    return true;
  }

  bool apply(const Op& op, std::vector<std::pair<size_t, size_t>>& regions) {
    const uint8_t c = op.code;
    if (op.is_string) {
      stack_.push_back({op.str == key_ ? kKeyString : kOther, op.at});
      return true;
    }
    switch (c) {
      case '}': stack_.push_back({kDict, op.at}); return true;
      case ']': stack_.push_back({kList, op.at}); return true;
      case '(': stack_.push_back({kMark, op.at}); return true;
      case 't': case 'l': case 'd': {
        size_t mark;
        if (!pop_to_mark(mark)) return false;
        const size_t start = stack_[mark].start;
        stack_.resize(mark);
        stack_.push_back({c == 'd' ? kDict : c == 'l' ? kList : kOther, start});
        return true;
      }
      case 0x85: case 0x86: case 0x87: {
        const size_t n = c - 0x84;
        if (stack_.size() < n) return false;
        const size_t start = stack_[stack_.size() - n].start;
        for (size_t k = 0; k < n; ++k) {
          if (stack_.back().kind == kMark) return false;
          stack_.pop_back();
        }
        stack_.push_back({kOther, start});
        return true;
      }
      case 'a':
        if (stack_.size() < 2 || stack_.back().kind == kMark) return false;
        stack_.pop_back();
        return true;
      case 'e': case '1': {
        size_t mark;
        if (!pop_to_mark(mark)) return false;
        stack_.resize(mark);
        return true;
      }
      case 's': {
        if (stack_.size() < 3) return false;
        const Slot k = stack_[stack_.size() - 2], v = stack_.back();
        if (stack_[stack_.size() - 3].kind == kDict && k.kind == kKeyString) regions.emplace_back(v.start, op.at);
        stack_.resize(stack_.size() - 2);
        return true;
      }
      case 'u': {
        size_t mark;
        if (!pop_to_mark(mark)) return false;
        if (mark > 0 && stack_[mark - 1].kind == kDict) {
          for (size_t i = mark + 1; i + 1 < stack_.size(); i += 2) {
            if (stack_[i].kind != kKeyString) continue;
            const size_t end = i + 2 < stack_.size() ? stack_[i + 2].start : op.at;
            regions.emplace_back(stack_[i + 1].start, end);
          }
        }
        stack_.resize(mark);
        return true;
      }
      case '0':
        if (stack_.empty()) return false;
        stack_.pop_back();
        return true;
      case '2':
        if (stack_.empty()) return false;
        stack_.push_back({stack_.back().kind == kMark ? kOther : stack_.back().kind, op.at});
        return true;
      case 'p': case 'q': case 'r': case 0x94: {
        if (stack_.empty()) return false;
        const uint64_t index = c == 0x94 ? memo_.size() : op.memo_index;
        if (index > memo_.size() + kMemoSlack) return false;
        if (index >= memo_.size()) memo_.resize(index + 1, kAbsent);
        memo_[index] = stack_.back().kind;
        return true;
      }
      case 'g': case 'h': case 'j':
        if (op.memo_index >= memo_.size() || memo_[op.memo_index] == kAbsent) return false;
        stack_.push_back({static_cast<Kind>(memo_[op.memo_index]), op.at});
        return true;
      case 0x80: case 0x95: case '.': return true;
      default: stack_.push_back({kOther, op.at}); return true;  // numbers, bytes, None, booleans, ()
    }
  }

  const uint8_t* p_;
  size_t size_;
  std::string_view key_;
  std::vector<Slot> stack_;
  std::vector<uint8_t> memo_;
};

}  // namespace

std::optional<std::string> strip_pickle_key(const uint8_t* data, size_t size, std::string_view key) {
  std::vector<std::pair<size_t, size_t>> found;
  if (!RegionFinder(data, size, key).run(found)) return std::nullopt;
  if (found.empty()) return std::nullopt;  // nothing to strip: the caller unpickles the file as it is
  std::sort(found.begin(), found.end());
  std::vector<std::pair<size_t, size_t>> regions;  // outermost only (a key's value inside another's)
  for (const auto& r : found) {
    if (!regions.empty() && r.first < regions.back().second) continue;
    regions.push_back(r);
  }
  // Pass 2: write the stream with each region replaced by EMPTY_LIST, after a NONE, <store>, POP for each
  // memo store inside it (later memo indices keep their meaning); refuse if a fetch outside the regions
  // needs an object built inside one. FRAME opcodes are dropped.
  std::string out;
  out.reserve(size);
  std::vector<uint8_t> memo;  // kAbsent, 0 (built outside regions) or kStripped
  size_t next = 0, pos = 0;
  bool inside = false;
  std::pair<size_t, size_t> last_scalar{0, 0};  // the previous opcode, when it pushed a string
  Op op;
  while (pos < size) {
    if (inside) {
      // Inside a region most opcodes are memo fetches, marks and appends that write nothing: step over
      // them without decoding (memo stores, strings and the rest take the general path below).
      const size_t stop = regions[next].second;
      const size_t before = pos;
      while (pos < stop) {
        const uint8_t c = data[pos];
        if (c == 'h') {
          pos += 2;
        } else if (c == 'j') {
          pos += 5;
        } else if (c == '(' || c == 'e' || c == 'a' || c == ']' || c == '}' || c == 'u' || c == 's' || c == 'N') {
          pos += 1;
        } else {
          break;
        }
      }
      if (pos > stop) return std::nullopt;  // not on an opcode boundary: cannot be (the scan passed)
      if (pos != before) last_scalar = {0, 0};
      if (pos >= size) break;
    }
    if (!read_op(data, size, pos, op)) return std::nullopt;
    if (inside && op.at == regions[next].second) {
      out.push_back(']');
      inside = false;
      ++next;
    }
    if (!inside && next < regions.size() && op.at == regions[next].first) inside = true;
    if (!inside && next < regions.size() && op.at > regions[next].first) return std::nullopt;  // not on a boundary
    if (is_memo_store(op.code)) {
      const uint64_t index = op.code == 0x94 ? memo.size() : op.memo_index;
      if (index > memo.size() + kMemoSlack) return std::nullopt;
      if (index >= memo.size()) memo.resize(index + 1, kAbsent);
      if (inside) {
        // A string stored right after it is made is written again (others may fetch it: an empty string
        // of a frame can be a setting's value); anything else gets a None in its place.
        const bool scalar = last_scalar.second > last_scalar.first;
        memo[index] = scalar ? 0 : kStripped;
        if (scalar) {
          out.append(reinterpret_cast<const char*>(data) + last_scalar.first, last_scalar.second - last_scalar.first);
        } else {
          out.push_back('N');
        }
      } else {
        memo[index] = 0;
      }
    } else if (is_memo_fetch(op.code) && !inside) {
      if (op.memo_index >= memo.size() || memo[op.memo_index] != 0) return std::nullopt;
    }
    if ((!inside || is_memo_store(op.code)) && op.code != 0x95) {
      out.append(reinterpret_cast<const char*>(data) + op.at, op.end - op.at);
    }
    if (inside && is_memo_store(op.code)) out.push_back('0');
    last_scalar = op.is_string ? std::make_pair(op.at, op.end) : std::make_pair(size_t{0}, size_t{0});
    pos = op.end;
    if (op.code == '.') return inside ? std::nullopt : std::optional<std::string>(std::move(out));
  }
  return std::nullopt;
}

}  // namespace torchmem
