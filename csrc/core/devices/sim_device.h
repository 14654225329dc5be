// SimDevice: a simulated accelerator. An address space with a capacity and no
// memory behind it, so a trace recorded on an 80 GiB GPU replays on a laptop.
//
// allocate() and map() count bytes against the capacity and fail (return
// 0 / false) exactly when the request exceeds what is free, as cudaMalloc
// does. Addresses must never be dereferenced.
//
// Addresses. By default each allocate() or reserve() takes a fresh range
// from a bump pointer; fresh ranges never overlap a live range and never
// start below the address floor. To replay a recording exactly, a caller
// may offer addresses (Note [Recorded addresses]):
// - offer(addr, size) queues an address for the next allocate(size) (or,
//   with size 0, for the next reserve() of any size; dropped at once when
//   addr lies in a live range, unless `while_live`: a range the next request
//   may give back before it reserves). A call takes the first
//   queued offer of its kind when the size matches and the range overlaps no
//   live range (a reserve() the first such base of all those queued);
//   otherwise it takes a fresh range. Offers never expire by
//   themselves: take_unused_offers() drops them and says how many were left.
// - adopt(addr, size) takes a segment at exactly `addr` (a segment that
//   existed before the replay began); false when it overlaps a live range or
//   exceeds what is free.
// Events: by default an event is complete once recorded (no asynchrony), so
// replays are unchanged. With set_manual_events(true) an event completes only
// when a test says so: complete_events(stream) completes those recorded on a
// stream so far, complete_all_events() every one; synchronize_event(id)
// completes that event (the host waited for its stream). Counters tell what
// the allocator asked of the device (events_recorded(), synchronizations(),
// live_events()).
// Capture: set_capturing(true) models a CUDA graph capture underway. The
// calls that would invalidate it or free addresses baked into it then throw
// std::logic_error naming the call: free, unmap, release, record_event,
// event_complete, synchronize_event (allocate, reserve and map are allowed,
// as cudaMalloc in relaxed capture mode is).
// Thread safety: every method takes an internal mutex (a ForkSafeMutex of
// rank kDevice, see fork_safety.h).
#pragma once

#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include "core/devices/device.h"
#include "core/sync/fork_safety.h"

namespace torchmem {

class SimDevice final : public Device {
 public:
  // in_use_by_others: bytes of the capacity held outside the allocator (a
  // CUDA context, communication buffers, other processes): never free.
  explicit SimDevice(size_t capacity_bytes, size_t page_size = 2u << 20, size_t in_use_by_others = 0);

  std::string name() const override { return "sim"; }
  uintptr_t allocate(size_t size) override;
  void free(uintptr_t addr, size_t size) override;
  size_t page_size() const override { return page_size_; }
  uintptr_t reserve(size_t size) override;
  bool map(uintptr_t addr, size_t size) override;
  void unmap(uintptr_t addr, size_t size) override;
  void release(uintptr_t addr, size_t size) override;
  size_t total_bytes() const override { return capacity_; }
  size_t free_bytes() const override;

  EventId record_event(Stream stream) override;
  bool event_complete(EventId id) override;
  void synchronize_event(EventId id) override;
  void destroy_event(EventId id) override;

  // Events and capture: see the header comment.
  void set_manual_events(bool manual);
  size_t complete_events(Stream stream);
  size_t complete_all_events();
  size_t live_events() const;
  size_t events_recorded() const;
  size_t synchronizations() const;
  void set_capturing(bool capturing);
  // map() and unmap() calls so far (expandable segments batch their pages).
  size_t map_calls() const;
  size_t unmap_calls() const;

  // Segments from allocate() or adopt() not yet freed (for leak checks;
  // mapped pages show in total_bytes() - free_bytes()).
  size_t live_segments() const;

  // Recorded addresses: see the header comment.
  void offer(uintptr_t addr, size_t size, bool while_live = false);
  size_t take_unused_offers();
  bool adopt(uintptr_t addr, size_t size);
  // Fresh ranges start at or above `floor` (e.g. above every recorded address).
  void set_address_floor(uintptr_t floor);
  // allocate()/reserve() calls that took an offered address, and that took a
  // fresh range although an offer was queued.
  size_t offers_taken() const;
  size_t offers_refused() const;

 private:
  struct Offer {
    uintptr_t addr;
    size_t size;  // 0: a reserve() of any size
  };
  uintptr_t take_addresses(size_t size, bool reserving);
  void check_not_capturing(const char* call) const;
  bool overlaps_live(uintptr_t addr, size_t size) const;

  const size_t capacity_;
  const size_t page_size_;
  mutable ForkSafeMutex mutex_{LockRank::kDevice};
  size_t used_ = 0;                    // bytes allocated, adopted or mapped
  size_t live_ = 0;                    // segments not yet freed
  uintptr_t next_address_;             // bump pointer for fresh ranges
  std::map<uintptr_t, size_t> ranges_; // live segments and reserved ranges, by start
  std::deque<Offer> offers_;
  size_t offers_taken_ = 0;
  size_t offers_refused_ = 0;
  struct Event {
    Stream stream;
    bool complete;
  };
  bool manual_events_ = false;
  bool capturing_ = false;
  EventId next_event_ = 0;
  std::map<EventId, Event> events_;  // recorded and not destroyed
  size_t events_recorded_ = 0;
  size_t synchronizations_ = 0;
  size_t map_calls_ = 0;
  size_t unmap_calls_ = 0;
};

}  // namespace torchmem
