#include "core/traces/pickle_scan.h"

#include <cstdio>
#include <cstring>
#include <string_view>

namespace torchmem {

namespace {

// Little-endian unsigned integer of `n` bytes at p (n <= 8).
uint64_t read_le(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 80)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return out;
}

class Scanner {
 public:
  Scanner(const uint8_t* data, size_t size) : p_(data), size_(size) {}

  PickleScan run() {
    while (pos_ < size_) {
      op_at_ = pos_;
      const uint8_t op = p_[pos_++];
      if (!step(op)) return result_;
      if (stopped_) {
        result_.plain = true;
        result_.offset = op_at_;
        return result_;
      }
    }
    return fail(size_, "it ends before its STOP opcode: a truncated file?");
  }

 private:
  PickleScan fail(size_t offset, std::string problem) {
    result_.plain = false;
    result_.offset = offset;
    result_.problem = std::move(problem);
    return result_;
  }

  bool refuse(std::string problem) {
    fail(op_at_, std::move(problem));
    return false;
  }

  bool truncated() {
    fail(size_, "it ends inside an opcode's argument: a truncated file?");
    return false;
  }

  // Skips n argument bytes; false (truncated) when fewer are left.
  bool skip(uint64_t n) {
    if (n > size_ - pos_) return truncated();
    pos_ += static_cast<size_t>(n);
    return true;
  }

  // A length of `width` bytes, then that many bytes; the bytes are kept as the last string.
  bool counted(size_t width, bool is_string) {
    if (width > size_ - pos_) return truncated();
    const uint64_t n = read_le(p_ + pos_, width);
    pos_ += width;
    const size_t start = pos_;
    if (!skip(n)) return false;
    if (is_string) remember(std::string_view(reinterpret_cast<const char*>(p_) + start, pos_ - start));
    return true;
  }

  // A text argument ending at "\n" (protocol 0).
  bool line(std::string_view* out = nullptr) {
    const void* nl = std::memchr(p_ + pos_, '\n', size_ - pos_);
    if (nl == nullptr) return truncated();
    const size_t end = static_cast<const uint8_t*>(nl) - p_;
    if (out) *out = std::string_view(reinterpret_cast<const char*>(p_) + pos_, end - pos_);
    pos_ = end + 1;
    return true;
  }

  void remember(std::string_view s) {
    older_ = last_;
    last_ = s;
  }

  bool names(const char* opcode) {
    std::string_view module, name;
    if (!line(&module) || !line(&name)) return false;
    return refuse("it names " + printable(module) + "." + printable(name) + " (" + opcode +
                  "): code or a class, not plain data");
  }

  bool step(uint8_t op) {
    switch (op) {
      // Structure: stack, marks, containers.
      case '(': case '0': case '1': case '2':               // MARK POP POP_MARK DUP
      case '}': case ']': case ')': case 't': case 'd': case 'l':  // EMPTY_DICT EMPTY_LIST EMPTY_TUPLE TUPLE DICT LIST
      case 0x85: case 0x86: case 0x87:                      // TUPLE1 TUPLE2 TUPLE3
      case 'a': case 'e': case 's': case 'u':               // APPEND APPENDS SETITEM SETITEMS
      case 'N': case 0x88: case 0x89:                       // NONE NEWTRUE NEWFALSE
      case 0x94:                                            // MEMOIZE
        return true;
      case '.':                                             // STOP
        stopped_ = true;
        return true;
      case 0x80: return skip(1);                            // PROTO
      case 0x95: return skip(8);                            // FRAME (its opcodes follow inline)
      // Numbers.
      case 'I': case 'L': case 'F': return line();          // INT LONG FLOAT (text)
      case 'J': return skip(4);                             // BININT
      case 'K': return skip(1);                             // BININT1
      case 'M': return skip(2);                             // BININT2
      case 'G': return skip(8);                             // BINFLOAT
      case 0x8a: return counted(1, false);                  // LONG1
      case 0x8b: return counted(4, false);                  // LONG4
      // Strings and bytes.
      case 'S': case 'V': {                                 // STRING UNICODE (text)
        std::string_view s;
        if (!line(&s)) return false;
        remember(s);
        return true;
      }
      case 'T': return counted(4, true);                    // BINSTRING
      case 'U': return counted(1, true);                    // SHORT_BINSTRING
      case 'X': return counted(4, true);                    // BINUNICODE
      case 0x8c: return counted(1, true);                   // SHORT_BINUNICODE
      case 0x8d: return counted(8, true);                   // BINUNICODE8
      case 'B': return counted(4, false);                   // BINBYTES
      case 'C': return counted(1, false);                   // SHORT_BINBYTES
      case 0x8e: return counted(8, false);                  // BINBYTES8
      // Memo.
      case 'p': case 'g': return line();                    // PUT GET (text)
      case 'q': case 'h': return skip(1);                   // BINPUT BINGET
      case 'r': case 'j': return skip(4);                   // LONG_BINPUT LONG_BINGET
      // Refused: code and classes.
      case 'c': return names("GLOBAL");
      case 'i': return names("INST");
      case 0x93:
        return refuse("it names " + printable(older_) + "." + printable(last_) +
                      " (STACK_GLOBAL): code or a class, not plain data");
      case 'o': return refuse("it builds an object (OBJ): code or a class, not plain data");
      case 'R': return refuse("it calls a function (REDUCE): code, not plain data");
      case 'b': return refuse("it sets an object's state (BUILD): code, not plain data");
      case 0x81: return refuse("it builds an object (NEWOBJ): code or a class, not plain data");
      case 0x92: return refuse("it builds an object (NEWOBJ_EX): code or a class, not plain data");
      case 0x82: case 0x83: case 0x84:
        return refuse("it names a registered extension (EXT): code or a class, not plain data");
      case 'P': case 'Q':
        return refuse("it holds a persistent id (PERSID): a reference to an object outside the file");
      case 0x8f: case 0x90: return refuse("it holds a set, which a snapshot never holds");
      case 0x91: return refuse("it holds a frozenset, which a snapshot never holds");
      case 0x96: return refuse("it holds a bytearray, which a snapshot never holds");
      case 0x97: case 0x98: return refuse("it refers to an out-of-band buffer, which a snapshot never holds");
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        return refuse(std::string("byte ") + hex + " is not a pickle opcode: a damaged file?");
      }
    }
  }

  const uint8_t* p_;
  size_t size_;
  size_t pos_ = 0;
  size_t op_at_ = 0;
  bool stopped_ = false;
  std::string_view last_, older_;
  PickleScan result_;
};

}  // namespace

PickleScan scan_plain_pickle(const uint8_t* data, size_t size) { return Scanner(data, size).run(); }

}  // namespace torchmem
