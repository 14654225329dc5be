#include "core/device_memory/device_memory.h"

#include <algorithm>
#include <stdexcept>

namespace torchmem {

namespace {

using Graveyard = std::vector<std::shared_ptr<void>>;

template <typename T>
void bury(Graveyard& graveyard, std::vector<std::shared_ptr<T>>&& dead) {
  for (auto& p : dead) graveyard.push_back(std::move(p));
}

}  // namespace

DeviceMemory::DeviceMemory(Device& device, AllocatorConfig config)
    : device_(device), config_(std::move(config)), uses_(device) {
  main_ = make_allocator();
  main_fast_.store(main_.get(), std::memory_order_release);
}

DeviceMemory::~DeviceMemory() = default;

std::shared_ptr<DeviceAllocator> DeviceMemory::make_allocator() const {
  AllocatorConfig config;
  double fraction;
  size_t history_entries;
  History::ContextProvider provider;
  {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    config = config_;
    fraction = fraction_;
    history_entries = history_entries_;
    provider = history_provider_;
  }
  std::shared_ptr<DeviceAllocator> a = make_device_allocator(device_, config);
  if (main_) a->share_reserved(main_->device_reserved());  // a private pool: a fraction's limit counts every pool
  if (fraction >= 0.0) a->set_memory_fraction(fraction);
  if (history_entries) a->enable_history(history_entries, provider);
  // Before the out-of-memory retry releases the cache, frees of this
  // allocator waiting on streams are waited for (PyTorch's
  // synchronize_and_free_events). Called under a's lock: uses_ only.
  DeviceAllocator* raw = a.get();
  StreamUses* uses = const_cast<StreamUses*>(&uses_);
  a->set_pending_free_waiter([uses, raw] {
    std::vector<void*> ptrs;
    for (const StreamUses::Pending& p : uses->take_completed(true, raw)) ptrs.push_back(p.ptr);
    return ptrs;
  });
  return a;
}

std::shared_ptr<DeviceAllocator> DeviceMemory::main() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return main_;
}

AllocatorConfig DeviceMemory::config() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return config_;
}

bool DeviceMemory::reconfigure(const AllocatorConfig& config) {
  AllocatorConfig previous;
  {
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    if (main_->has_live_allocations() || pools_.count() != 0 || !routed_.empty()) return false;
    previous = config_;
    config_ = config;
  }
  std::shared_ptr<DeviceAllocator> fresh = make_allocator();
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  if (main_->has_live_allocations() || pools_.count() != 0 || !routed_.empty()) {
    config_ = previous;
    return false;
  }
  main_->empty_cache();
  old_mains_.push_back(main_);  // the fast paths may still hold its address
  main_ = std::move(fresh);
  main_->set_releases_blocked(capturing_locked());
  main_fast_.store(main_.get(), std::memory_order_release);
  return true;
}

// ---------------------------------------------------------------- allocation

void* DeviceMemory::allocate(size_t size, Stream stream, const std::shared_ptr<Allocator>& thread_allocator) {
  if (size == 0) return nullptr;
  std::shared_ptr<DeviceAllocator> pool;
  if (routing_.load(std::memory_order_acquire) || !uses_.nothing_pending()) {
    Graveyard graveyard;
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    if (!capturing_locked()) complete_locked(uses_.take_completed(false), graveyard);
    if (pools_.has_routes()) pool = pools_.route_for(stream);
  }
  if (pool) {
    void* ptr = pool->try_allocate(size, stream);
    if (!ptr) {
      // As PyTorch's retry, which releases the whole device's cache: the main
      // allocator's (and retired pools') cached segments go first.
      if (!release_for_pool()) pool->throw_out_of_memory(size, stream);
      ptr = pool->allocate(size, stream);
    }
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    pool_blocks_[ptr] = pool.get();
    update_slow_locked();
    return ptr;
  }
  if (thread_allocator) return thread_allocator->allocate(size, stream);
  return allocate_main(*main_fast_.load(std::memory_order_acquire), size, stream);
}

bool DeviceMemory::release_for_pool() {
  Graveyard graveyard;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  if (capturing_locked()) return false;
  auto reserved = [&] {
    int64_t total = main_->stats().reserved_bytes[kAggregate].current;
    for (auto& [id, pool] : pools_.retired()) total += pool->stats().reserved_bytes[kAggregate].current;
    return total;
  };
  const int64_t before = reserved();
  complete_locked(uses_.take_completed(true), graveyard);
  main_->empty_cache();
  for (auto& [id, pool] : pools_.retired()) pool->empty_cache();
  const int64_t after = reserved();
  drop_empty_retired_locked(graveyard);
  return after < before;
}

void* DeviceMemory::allocate_main(DeviceAllocator& main, size_t size, Stream stream) {
  if (void* ptr = main.try_allocate(size, stream)) return ptr;
  {
    // PyTorch's try_mempool_fallback: pools that opted in lend cached blocks.
    std::lock_guard<ForkSafeMutex> lock(mutex_);
    for (const auto& pool : pools_.use_on_oom()) {
      if (void* ptr = pool->allocate_cached(size, stream)) {
        pool_blocks_[ptr] = pool.get();
        update_slow_locked();
        return ptr;
      }
    }
  }
  main.throw_out_of_memory(size, stream);
  return nullptr;  // not reached
}

// ---------------------------------------------------------------- frees

bool DeviceMemory::free(void* ptr) {
  if (ptr == nullptr) return true;
  if (slow_frees_.load(std::memory_order_acquire) == 0 && uses_.idle()) {
    return main_fast_.load(std::memory_order_acquire)->try_deallocate(ptr);
  }
  Graveyard graveyard;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return free_locked(ptr, graveyard);
}

DeviceMemory::Owner DeviceMemory::owner_locked(const void* ptr) {
  auto it = pool_blocks_.find(const_cast<void*>(ptr));
  if (it != pool_blocks_.end()) {
    if (it->second->owns(ptr)) return Owner{it->second, nullptr};
    pool_blocks_.erase(it);  // completed by its pool's out-of-memory waiter
    update_slow_locked();
  }
  // Newest first: an allocator that wraps another routed one is made, and
  // pushed, after it, and must see its frees.
  for (auto r = routed_.rbegin(); r != routed_.rend(); ++r) {
    if ((*r)->owns(ptr)) return Owner{nullptr, r->get()};
  }
  return Owner{main_.get(), nullptr};
}

bool DeviceMemory::free_locked(void* ptr, Graveyard& graveyard) {
  const Owner owner = owner_locked(ptr);
  if (uses_.has_uses(ptr)) {
    if (owner.pool_or_main && !owner.pool_or_main->request_free(ptr)) {
      uses_.forget(ptr);
      return false;
    }
    Allocator* a = owner.routed ? owner.routed : static_cast<Allocator*>(owner.pool_or_main);
    uses_.defer_free(ptr, a, owner.routed == nullptr, capturing_locked());
    return true;
  }
  if (owner.routed) return deallocate_routed_locked(owner.routed, ptr, graveyard);
  if (!owner.pool_or_main->try_deallocate(ptr)) return false;
  if (owner.pool_or_main != main_.get()) after_pool_free_locked(owner.pool_or_main, ptr, graveyard);
  return true;
}

bool DeviceMemory::deallocate_routed_locked(Allocator* routed, void* ptr, Graveyard& graveyard) {
  try {
    routed->deallocate(ptr);
  } catch (const std::exception&) {
    return false;
  }
  if (!routed->has_live_allocations()) drop_unused_routed_locked(graveyard);
  return true;
}

void DeviceMemory::after_pool_free_locked(DeviceAllocator* pool, void* ptr, Graveyard& graveyard) {
  pool_blocks_.erase(ptr);
  update_slow_locked();
  if (!pools_.is_retired(pool)) return;
  // A retired pool gives its memory back as its blocks are freed.
  if (!capturing_locked()) pool->empty_cache();
  drop_empty_retired_locked(graveyard);
}

void DeviceMemory::complete_locked(const std::vector<StreamUses::Pending>& done, Graveyard& graveyard) {
  for (const StreamUses::Pending& p : done) {
    if (!p.two_step) {
      deallocate_routed_locked(p.owner, p.ptr, graveyard);
      continue;
    }
    auto* a = static_cast<DeviceAllocator*>(p.owner);
    try {
      a->complete_free(p.ptr);
    } catch (const std::logic_error&) {
      continue;  // completed by the allocator's out-of-memory waiter meanwhile
    }
    if (a != main_.get()) after_pool_free_locked(a, p.ptr, graveyard);
  }
}

void DeviceMemory::drop_empty_retired_locked(Graveyard& graveyard) {
  if (capturing_locked()) return;  // a dropped pool gives its segments back: not now
  for (auto& pool : pools_.drop_empty_retired()) {
    for (auto it = pool_blocks_.begin(); it != pool_blocks_.end();) {
      it = it->second == pool.get() ? pool_blocks_.erase(it) : std::next(it);
    }
    graveyard.push_back(std::move(pool));
  }
  update_slow_locked();
}

void DeviceMemory::update_slow_locked() {
  slow_frees_.store(pool_blocks_.size() + routed_.size(), std::memory_order_release);
}

bool DeviceMemory::owns(const void* ptr) const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  auto it = pool_blocks_.find(const_cast<void*>(ptr));
  if (it != pool_blocks_.end() && it->second->owns(ptr)) return true;
  for (const auto& r : routed_) {
    if (r->owns(ptr)) return true;
  }
  return main_->owns(ptr);
}

bool DeviceMemory::record_stream(void* ptr, Stream stream) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  const Owner owner = owner_locked(ptr);
  Allocator* a = owner.routed ? owner.routed : static_cast<Allocator*>(owner.pool_or_main);
  if (!a->owns(ptr)) return false;
  Stream own = 0;
  if (owner.pool_or_main && owner.pool_or_main->allocation_stream(ptr, &own) && own == stream) {
    return true;  // its own stream needs no wait, as PyTorch
  }
  uses_.record(ptr, stream);
  return true;
}

// ---------------------------------------------------------------- caches and pools

void DeviceMemory::empty_cache() {
  Graveyard graveyard;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  if (capturing_locked()) return;  // Note [Capture rules]
  complete_locked(uses_.take_completed(true), graveyard);
  main_->empty_cache();
  for (auto& [id, pool] : pools_.retired()) pool->empty_cache();
  drop_empty_retired_locked(graveyard);
}

bool DeviceMemory::empty_pool_cache(PoolId id) {
  Graveyard graveyard;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  std::shared_ptr<DeviceAllocator> pool = id == kDefaultPool ? main_ : pools_.find(id);
  if (!pool || capturing_locked()) return false;
  complete_locked(uses_.take_completed(true), graveyard);
  pool->empty_cache();
  drop_empty_retired_locked(graveyard);
  return true;
}

void DeviceMemory::set_memory_fraction(double fraction) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  main_->set_memory_fraction(fraction);  // throws std::invalid_argument outside [0, 1]
  fraction_ = fraction;
  for (auto& a : all_locked()) a->set_memory_fraction(fraction);
}

double DeviceMemory::memory_fraction() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return fraction_ >= 0.0 ? fraction_ : config_.per_process_memory_fraction;
}

void DeviceMemory::create_or_incref_pool(PoolId id) {
  std::shared_ptr<DeviceAllocator> fresh = make_allocator();  // destroyed unused after the lock
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  DeviceAllocator* made = fresh.get();
  if (pools_.create_or_incref(id, fresh)) made->set_releases_blocked(capturing_locked());
}

void DeviceMemory::begin_allocate_to_pool(PoolId id, Filter filter, bool capture) {
  std::shared_ptr<DeviceAllocator> fresh = make_allocator();
  Graveyard graveyard;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  DeviceAllocator* made = fresh.get();
  if (pools_.begin_route(id, std::move(filter), capture, fresh)) made->set_releases_blocked(capturing_locked());
  set_capturing_locked(graveyard);
}

void DeviceMemory::end_allocate_to_pool(PoolId id) {
  Graveyard graveyard;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  pools_.end_route(id);
  set_capturing_locked(graveyard);
}

void DeviceMemory::mark_capture(bool begin) {
  Graveyard graveyard;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  marked_captures_ = std::max(0, marked_captures_ + (begin ? 1 : -1));
  set_capturing_locked(graveyard);
}

bool DeviceMemory::release_pool(PoolId id) {
  Graveyard graveyard;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  if (!pools_.release(id)) return false;
  if (pools_.use_count(id) == 0 && !capturing_locked()) {
    if (auto pool = pools_.find(id)) pool->empty_cache();
  }
  drop_empty_retired_locked(graveyard);
  return true;
}

bool DeviceMemory::set_use_on_oom(PoolId id, bool use_on_oom) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return pools_.set_use_on_oom(id, use_on_oom);
}

int DeviceMemory::pool_use_count(PoolId id) const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return pools_.use_count(id);
}

size_t DeviceMemory::pool_count() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  return pools_.count();
}

void DeviceMemory::set_capturing_locked(Graveyard& graveyard) {
  routing_.store(pools_.has_routes(), std::memory_order_release);
  const bool capturing = capturing_locked();
  if (capturing == capturing_.load()) return;
  for (auto& a : all_locked()) a->set_releases_blocked(capturing);
  capturing_.store(capturing, std::memory_order_release);
  if (capturing) return;
  // What the capture held back: retired pools' caches.
  for (auto& [id, pool] : pools_.retired()) pool->empty_cache();
  drop_empty_retired_locked(graveyard);
}

// ---------------------------------------------------------------- routed allocators

void DeviceMemory::add_routed(std::shared_ptr<Allocator> allocator) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  if (std::find(routed_.begin(), routed_.end(), allocator) == routed_.end()) routed_.push_back(std::move(allocator));
  update_slow_locked();
}

void DeviceMemory::drop_unused_routed() {
  Graveyard graveyard;
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  drop_unused_routed_locked(graveyard);
}

void DeviceMemory::drop_unused_routed_locked(Graveyard& graveyard) {
  for (auto it = routed_.begin(); it != routed_.end();) {
    if (it->use_count() == 1 && !(*it)->has_live_allocations()) {
      graveyard.push_back(std::move(*it));
      it = routed_.erase(it);
    } else {
      ++it;
    }
  }
  update_slow_locked();
}

// ---------------------------------------------------------------- statistics and history

std::vector<std::shared_ptr<DeviceAllocator>> DeviceMemory::all_locked() const {
  std::vector<std::shared_ptr<DeviceAllocator>> all{main_};
  for (auto& [id, a] : pools_.live()) all.push_back(a);
  for (auto& [id, a] : pools_.retired()) all.push_back(a);
  return all;
}

std::vector<PrivatePools::Entry> DeviceMemory::allocators() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  std::vector<PrivatePools::Entry> all{{kDefaultPool, main_}};
  for (auto& e : pools_.live()) all.push_back(e);
  for (auto& e : pools_.retired()) all.push_back(e);
  return all;
}

DeviceStats DeviceMemory::stats() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  DeviceStats total;
  for (auto& a : all_locked()) add_stats(total, a->stats());
  return total;
}

void DeviceMemory::reset_peak_stats() {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  for (auto& a : all_locked()) a->reset_peak_stats();
}

void DeviceMemory::reset_accumulated_stats() {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  for (auto& a : all_locked()) a->reset_accumulated_stats();
}

size_t DeviceMemory::largest_free_block() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  size_t largest = 0;
  for (auto& a : all_locked()) largest = std::max(largest, a->largest_free_block());
  return largest;
}

void DeviceMemory::enable_history(size_t max_entries, History::ContextProvider provider, bool clear) {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  history_entries_ = max_entries;
  history_provider_ = max_entries ? std::move(provider) : nullptr;
  for (auto& a : all_locked()) {
    if (clear) a->enable_history(0);
    a->enable_history(history_entries_, history_provider_);
  }
}

void DeviceMemory::check_invariants() const {
  std::lock_guard<ForkSafeMutex> lock(mutex_);
  for (auto& a : all_locked()) a->check_invariants();
  for (const auto& [ptr, pool] : pool_blocks_) {
    bool known = false;
    for (auto& a : all_locked()) known = known || a.get() == pool;
    if (!known) throw std::logic_error("device memory invariant broken: a pool block's pool is gone");
  }
}

}  // namespace torchmem
