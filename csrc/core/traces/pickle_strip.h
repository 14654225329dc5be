// strip_pickle_key: a plain pickle without the values of one dict key.
//
// Replaying a snapshot needs its trace and segments, not the stacks: in a
// snapshot of a million entries with PyTorch's stacks, unpickling the
// `frames` lists is most of the load. strip_pickle_key rewrites the opcode
// stream so that every value of a dict key equal to `key` (at any depth
// outside another stripped value) becomes an empty list, and the unpickler
// never builds it. The rest unpickles to exactly what it was.
//
// How: the stack of the unpickler is followed opcode by opcode (what each
// item is: a mark, a dict, a list, a string equal to `key`, another value).
// A string equal to `key` pushed where a dict key goes (an even count above
// the mark over a dict, or right over a dict for SETITEM) starts a stripped
// region at the next opcode that is not a memo store; the region ends before
// the first opcode, with the value alone on its level, that neither stores
// it in the memo nor appends to it. The region is written as `EMPTY_LIST`,
// preceded by a `NONE, <memo store>, POP` for each memo store inside it, so
// every later memo index keeps its meaning. FRAME opcodes are dropped (they
// are optional, and their lengths would be wrong).
//
// Returns nullopt, and the caller unpickles the whole file, when the
// rewrite cannot be sure: a memo fetch outside a stripped region of an
// object built inside one (then the object is needed elsewhere), an
// unexpected stack, or memo indices far from dense.
//
// Precondition: scan_plain_pickle(data, size).plain (only plain opcodes).
// Thread-safe (a pure function of its input); linear time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace torchmem {

std::optional<std::string> strip_pickle_key(const uint8_t* data, size_t size, std::string_view key);

}  // namespace torchmem
