// The one interface every torchmem allocator implements (caching, arena,
// planned slab): allocate and deallocate, with a stream. Cross-cutting
// concerns (statistics, history, fault injection) are wrappers or live in
// the allocators' own stats, not in callers.
//
// Contract:
// - allocate(size, stream) returns a pointer aligned to at least 64 bytes,
//   or throws OutOfMemory (out_of_memory.h) when the allocator cannot serve
//   the request. allocate(0) returns nullptr.
// - deallocate(ptr) accepts exactly the pointers allocate() returned and not
//   yet deallocated, plus nullptr (ignored). Any other pointer throws
//   std::invalid_argument and leaves the allocator unchanged.
// - owns(ptr) tells whether ptr is a live allocation of this allocator.
// - has_live_allocations(): see below; override it.
// - Implementations are thread safe unless their header says otherwise.
#pragma once

#include <cstddef>

#include "core/devices/device.h"

namespace torchmem {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t size, Stream stream = 0) = 0;
  virtual void deallocate(void* ptr) = 0;
  virtual bool owns(const void* ptr) const = 0;
  // Whether any allocation is still live. Glue code keeps an allocator
  // registered (so deleters can find it) until this turns false.
  virtual bool has_live_allocations() const { return true; }
};

}  // namespace torchmem
