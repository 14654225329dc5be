// scan_plain_pickle: does a pickle hold plain data only? Checked before
// anything unpickles it.
//
// A memory snapshot is a tree of dicts, lists, tuples, str, bytes, int,
// float, bool and None. A pickle can also name any Python callable and call
// it on load (GLOBAL or STACK_GLOBAL, then REDUCE: `os.system` in 200
// bytes). The scan walks the opcode stream, protocols 0 to 5, and accepts
// only the opcodes that build plain values (and the stack, mark, memo and
// frame opcodes around them). Refused, with the byte offset of the opcode:
// - GLOBAL, STACK_GLOBAL, INST, OBJ, REDUCE, BUILD, NEWOBJ, NEWOBJ_EX,
//   EXT1/2/4 (code and classes); the name a GLOBAL, INST or STACK_GLOBAL
//   gives ("os.system") is reported;
// - PERSID, BINPERSID (references outside the file);
// - EMPTY_SET, ADDITEMS, FROZENSET, BYTEARRAY8, NEXT_BUFFER,
//   READONLY_BUFFER (types a snapshot never holds);
// - any byte that is not an opcode, and a pickle that ends before STOP
//   (a truncated file), or an argument longer than what is left.
// Bytes after STOP are not read (pickle.load stops there too).
//
// The scan allocates nothing per opcode and keeps no state beyond the last
// two strings (for STACK_GLOBAL's message): linear time, constant memory,
// any input. Thread-safe (a pure function of its input).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace torchmem {

struct PickleScan {
  bool plain = false;   // true: only plain-data opcodes up to STOP
  size_t offset = 0;    // byte of the refused opcode (or the end, when truncated)
  std::string problem;  // e.g. "it names os.system (GLOBAL), code or a class, not plain data"
};

PickleScan scan_plain_pickle(const uint8_t* data, size_t size);

}  // namespace torchmem
