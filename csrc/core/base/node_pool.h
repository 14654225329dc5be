// NodePool: a free list of fixed-size chunks, so the caching allocator's hot
// path (blocks, ordered-set and hash-map nodes) allocates no heap memory once
// warm. PoolAllocator<T> is a standard allocator over a NodePool; requests
// larger than a chunk (a hash map's bucket array) go to operator new.
//
// Not thread safe: the owner uses it under its own lock. Chunks are released
// only when the pool is destroyed, after every container using it.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace torchmem {

class NodePool {
 public:
  // Fits a Block (caching allocator) and a set or hash-map node: a smaller
  // chunk is less memory per live block (many tiny tensors on the CPU).
  static constexpr size_t kChunk = 96;

  NodePool() = default;
  NodePool(const NodePool&) = delete;
  NodePool& operator=(const NodePool&) = delete;
  ~NodePool() {
    for (char* slab : slabs_) ::operator delete(slab);
  }

  void* take() {
    if (!free_) refill();
    Free* f = free_;
    free_ = f->next;
    return f;
  }
  void give(void* p) { free_ = new (p) Free{free_}; }

 private:
  struct Free {
    Free* next;
  };
  void refill() {
    constexpr size_t kPerSlab = 512;
    char* slab = static_cast<char*>(::operator new(kChunk * kPerSlab));
    slabs_.push_back(slab);
    for (size_t i = 0; i < kPerSlab; ++i) give(slab + i * kChunk);
  }

  Free* free_ = nullptr;
  std::vector<char*> slabs_;
};

template <typename T>
struct PoolAllocator {
  using value_type = T;
  NodePool* pool;

  explicit PoolAllocator(NodePool* p) : pool(p) {}
  template <typename U>
  PoolAllocator(const PoolAllocator<U>& other) : pool(other.pool) {}

  T* allocate(size_t n) {
    if (n * sizeof(T) <= NodePool::kChunk && alignof(T) <= alignof(std::max_align_t)) return static_cast<T*>(pool->take());
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) {
    if (n * sizeof(T) <= NodePool::kChunk && alignof(T) <= alignof(std::max_align_t)) {
      pool->give(p);
    } else {
      ::operator delete(p);
    }
  }
  template <typename U>
  bool operator==(const PoolAllocator<U>& o) const { return pool == o.pool; }
  template <typename U>
  bool operator!=(const PoolAllocator<U>& o) const { return pool != o.pool; }
};

}  // namespace torchmem
