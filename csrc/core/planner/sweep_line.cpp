#include "core/planner/sweep_line.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

namespace torchmem::planner {

namespace {

class FreeList {
 public:
  Offset allocate(Offset size) {
    auto it = by_size_.lower_bound({size, -1});
    if (it != by_size_.end()) {
      const auto [hole, off] = *it;
      erase(off, hole);
      if (hole > size) insert(off + size, hole - size);
      return off;
    }
    // Grow the top, starting inside a hole that touches it.
    if (!by_offset_.empty()) {
      auto last = std::prev(by_offset_.end());
      if (last->first + last->second == top_) {
        const Offset off = last->first;
        erase(off, last->second);
        top_ = off + size;
        return off;
      }
    }
    const Offset off = top_;
    top_ += size;
    return off;
  }

  void release(Offset off, Offset size) {
    auto next = by_offset_.lower_bound(off);
    if (next != by_offset_.end() && next->first == off + size) {
      size += next->second;
      erase(next->first, next->second);
    }
    auto prev = by_offset_.lower_bound(off);
    if (prev != by_offset_.begin()) {
      --prev;
      if (prev->first + prev->second == off) {
        off = prev->first;
        size += prev->second;
        erase(prev->first, prev->second);
      }
    }
    insert(off, size);
  }

 private:
  void insert(Offset off, Offset size) {
    by_offset_[off] = size;
    by_size_.insert({size, off});
  }
  void erase(Offset off, Offset size) {
    by_offset_.erase(off);
    by_size_.erase({size, off});
  }

  std::map<Offset, Offset> by_offset_;
  std::set<std::pair<Offset, Offset>> by_size_;
  Offset top_ = 0;
};

}  // namespace

std::vector<Offset> place_sweep_line(const std::vector<Buffer>& buffers) {
  // (time, kind: 0 free / 1 alloc, -size, index)
  std::vector<std::tuple<Time, int, int64_t, int32_t>> events;
  events.reserve(buffers.size() * 2);
  for (int32_t i = 0; i < int32_t(buffers.size()); ++i) {
    if (buffers[i].size == 0) continue;
    events.emplace_back(buffers[i].lower, 1, -buffers[i].size, i);
    events.emplace_back(buffers[i].upper, 0, -buffers[i].size, i);
  }
  std::sort(events.begin(), events.end());
  std::vector<Offset> offsets(buffers.size(), 0);
  FreeList free_list;
  for (const auto& [t, kind, neg_size, i] : events) {
    if (kind == 1) {
      offsets[i] = free_list.allocate(-neg_size);
    } else {
      free_list.release(offsets[i], -neg_size);
    }
  }
  return offsets;
}

}  // namespace torchmem::planner
