// aligned_allocator<T, Align>: a standard allocator whose storage is aligned
// to Align bytes, so std::vector<float, aligned_allocator<float, 64>> keeps
// 64-byte alignment through every reallocation (for SIMD loads, cache lines,
// or DMA). Storage comes from the aligned global operator new; Align must be
// a power of two no smaller than alignof(T). Stateless: all instances compare
// equal, and rebinding keeps the alignment.
#pragma once

#include <cstddef>
#include <limits>
#include <new>

namespace torchmem {

template <typename T, std::size_t Align = 64>
class aligned_allocator {
  static_assert(Align != 0 && (Align & (Align - 1)) == 0, "Align must be a power of two");
  static_assert(Align >= alignof(T), "Align must be at least alignof(T)");

 public:
  using value_type = T;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;
  using is_always_equal = std::true_type;
  static constexpr std::size_t alignment = Align;

  template <typename U>
  struct rebind {
    using other = aligned_allocator<U, Align>;
  };

  aligned_allocator() noexcept = default;
  template <typename U>
  aligned_allocator(const aligned_allocator<U, Align>&) noexcept {}

  T* allocate(std::size_t n) {
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(Align)));
  }

  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, std::align_val_t(Align)); }
};

template <typename T, typename U, std::size_t A>
bool operator==(const aligned_allocator<T, A>&, const aligned_allocator<U, A>&) noexcept {
  return true;
}
template <typename T, typename U, std::size_t A>
bool operator!=(const aligned_allocator<T, A>&, const aligned_allocator<U, A>&) noexcept {
  return false;
}

}  // namespace torchmem
