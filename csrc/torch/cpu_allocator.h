// CpuAllocator: the c10::Allocator that makes torchmem PyTorch's CPU
// allocator (c10::SetAllocator(kCPU, ...)).
//
// Contract and pitfalls (see docs/design.md, "PyTorch's hooks"):
// - One instance for the whole process, never destroyed: storages keep a
//   pointer to the allocator that made them and call it after uninstall().
// - raw_deleter() is implemented and each DataPtr's context equals its data
//   pointer (zero-byte allocations: both null), so raw_allocate /
//   raw_deallocate (used by oneDNN) work.
// - The deleter hands pointers it does not own (made before install()) to the
//   previous allocator's deleter.
// - A thread may route its allocations to another torchmem Allocator (an
//   arena) with push_thread_allocator(); the deleter finds it again on any
//   thread while it has live allocations.
// - Out of memory: the observers of oom_observers() are told (outside the
//   caching allocator's lock) before c10::OutOfMemoryError is raised, and
//   their notes end its message; this holds for thread allocators too.
// - install()/uninstall() are not thread safe with respect to concurrent
//   allocation by other threads (neither is c10::SetAllocator).
// - Fork: the routing table is under a ForkSafeMutex of rank kRouting and
//   every allocator behind it locks itself with one (core/sync/fork_safety.h), so
//   a forked child allocates, frees its parent's tensors (current, retired
//   and routed allocators alike) and never waits on a lock a parent thread
//   held. Only the forking thread's routes survive in the child; allocators
//   that other threads had pushed stay registered, to free what they own.
//   Allocators are made and dropped outside the routing lock (the contract
//   of ForkSafeMutex).
#pragma once

#include <c10/core/Allocator.h>

#include <memory>
#include <mutex>
#include <vector>

#include "core/base/alloc_config.h"
#include "core/base/device_allocator.h"
#include "core/base/oom_observers.h"
#include "core/devices/host_device.h"
#include "core/sync/fork_safety.h"

namespace torchmem::glue {

class CpuAllocator final : public c10::Allocator {
 public:
  static CpuAllocator& instance();

  // Makes torchmem the CPU allocator with this config: the allocator its
  // policy asks for (make_device_allocator: native caching, or stitch) on a
  // HostDevice. Reinstalling with a different config starts a new
  // allocator; the old one empties its
  // cache and keeps serving frees of its live blocks. Throws std::runtime_error
  // when c10 keeps another allocator (one registered with a higher priority).
  void install(const AllocatorConfig& config);
  void uninstall();
  bool installed() const { return installed_; }

  // The allocator serving allocations (null before the first install).
  std::shared_ptr<DeviceAllocator> caching() const;

  // Told of every out-of-memory error this allocator raises (device 0).
  OomObservers& oom_observers() { return oom_observers_; }

  static void push_thread_allocator(std::shared_ptr<torchmem::Allocator> allocator);
  static void pop_thread_allocator();

  c10::DataPtr allocate(size_t n) override;
  c10::DeleterFnPtr raw_deleter() const override { return &delete_pointer; }
  void copy_data(void* dest, const void* src, std::size_t count) const override;

 private:
  CpuAllocator() = default;
  static void delete_pointer(void* ptr);
  void release(void* ptr);

  mutable ForkSafeMutex mutex_{LockRank::kRouting};
  bool installed_ = false;
  c10::Allocator* previous_ = nullptr;
  c10::DeleterFnPtr previous_deleter_ = nullptr;
  std::shared_ptr<HostDevice> device_;
  std::shared_ptr<DeviceAllocator> caching_;
  std::vector<std::shared_ptr<HostDevice>> retired_devices_;
  OomObservers oom_observers_;
  std::vector<std::shared_ptr<DeviceAllocator>> retired_;   // still own live blocks
  // Thread allocators seen. Replaced on push/pop, never changed in place, so
  // a free takes the list with one reference count instead of copying it.
  using RoutedList = std::vector<std::shared_ptr<torchmem::Allocator>>;
  std::shared_ptr<const RoutedList> routed_ = std::make_shared<const RoutedList>();
};

}  // namespace torchmem::glue
