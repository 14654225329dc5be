// std::pmr adapters over torchmem allocators, so standard containers
// (std::pmr::vector, std::pmr::string, ...) draw from an Arena or a
// CachingAllocator:
//
//   torchmem::Arena arena(device, {1 << 20});
//   torchmem::ArenaResource resource(arena);
//   std::pmr::vector<float> v(&resource);
//
// AllocatorResource wraps any torchmem::Allocator. Allocators guarantee
// 64-byte alignment; a stricter alignment is served by over-allocating and
// storing the original pointer just below the aligned one. ArenaResource
// asks the arena for the exact alignment instead (no padding beyond it).
//
// Ownership: the resource does not own the allocator, which must outlive it
// and every container using it. Thread safety: that of the allocator.
// Two resources compare equal only if they are the same object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory_resource>

#include "core/allocators/arena.h"
#include "core/base/allocator.h"

namespace torchmem {

class AllocatorResource : public std::pmr::memory_resource {
 public:
  explicit AllocatorResource(Allocator& allocator) : allocator_(allocator) {}
  Allocator& allocator() const { return allocator_; }

 protected:
  void* do_allocate(size_t bytes, size_t alignment) override {
    if (bytes == 0) bytes = 1;  // a pmr resource never returns nullptr
    if (alignment <= kGuaranteed) return allocator_.allocate(bytes);
    char* raw = static_cast<char*>(allocator_.allocate(bytes + alignment));
    const uintptr_t aligned = (reinterpret_cast<uintptr_t>(raw) + alignment) & ~(uintptr_t(alignment) - 1);
    // aligned - raw >= kGuaranteed, so the slot below holds the original pointer.
    reinterpret_cast<void**>(aligned)[-1] = raw;
    return reinterpret_cast<void*>(aligned);
  }

  void do_deallocate(void* p, size_t, size_t alignment) override {
    if (alignment <= kGuaranteed)
      allocator_.deallocate(p);
    else
      allocator_.deallocate(static_cast<void**>(p)[-1]);
  }

  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override { return this == &other; }

 private:
  static constexpr size_t kGuaranteed = 64;  // Allocator contract
  Allocator& allocator_;
};

class ArenaResource : public std::pmr::memory_resource {
 public:
  explicit ArenaResource(Arena& arena) : arena_(arena) {}
  Arena& arena() const { return arena_; }

 protected:
  void* do_allocate(size_t bytes, size_t alignment) override {
    return arena_.allocate_aligned(bytes == 0 ? 1 : bytes, alignment);
  }
  void do_deallocate(void* p, size_t, size_t) override { arena_.deallocate(p); }
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override { return this == &other; }

 private:
  Arena& arena_;
};

}  // namespace torchmem
