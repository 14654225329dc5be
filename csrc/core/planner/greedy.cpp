#include "core/planner/greedy.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "core/planner/intervals.h"
#include "core/planner/lower_bound.h"

namespace torchmem::planner {

std::vector<Offset> place_naive(const std::vector<Buffer>& buffers) {
  std::vector<Offset> offsets(buffers.size());
  Offset top = 0;
  for (size_t i = 0; i < buffers.size(); ++i) {
    offsets[i] = top;
    top += buffers[i].size;
  }
  return offsets;
}

std::vector<Offset> place_best_fit(const std::vector<Buffer>& buffers, const std::vector<int32_t>& order) {
  return place_best_fit_around(buffers, order, std::vector<Offset>(buffers.size(), 0), 0);
}

std::vector<Offset> place_best_fit_around(const std::vector<Buffer>& buffers, const std::vector<int32_t>& order,
                                          std::vector<Offset> offsets, size_t fixed) {
  OverlapIndex index(buffers, /*all_active=*/false);
  std::vector<std::pair<Offset, Offset>> used;  // [offset, end) of placed neighbours
  for (size_t k = 0; k < order.size(); ++k) {
    const int32_t b = order[k];
    const int64_t size = buffers[b].size;
    if (k < fixed) {
      index.activate(b);
      continue;
    }
    if (size == 0) {
      offsets[b] = 0;
      continue;
    }
    used.clear();
    index.for_each_overlap(b, [&](int32_t j) {
      if (buffers[j].size > 0) used.emplace_back(offsets[j], offsets[j] + buffers[j].size);
    });
    std::sort(used.begin(), used.end());
    Offset cur = 0, best = -1, best_gap = std::numeric_limits<Offset>::max();
    for (const auto& [lo, hi] : used) {
      if (lo > cur) {
        const Offset gap = lo - cur;
        if (gap >= size && gap < best_gap) {
          best_gap = gap;
          best = cur;
        }
      }
      cur = std::max(cur, hi);
    }
    offsets[b] = best >= 0 ? best : cur;
    index.activate(b);
  }
  return offsets;
}

std::vector<int32_t> make_order(const std::vector<Buffer>& buffers, Order order) {
  const int32_t n = int32_t(buffers.size());
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::vector<int64_t> key(n);
  switch (order) {
    case Order::kSizeDesc:
      for (int32_t i = 0; i < n; ++i) key[i] = -buffers[i].size;
      break;
    case Order::kAreaDesc:
      for (int32_t i = 0; i < n; ++i) {
        const double area = double(buffers[i].size) * double(buffers[i].upper - buffers[i].lower);
        key[i] = -int64_t(std::min(area, 9e18));
      }
      break;
    case Order::kLengthDesc:
      for (int32_t i = 0; i < n; ++i) key[i] = -(buffers[i].upper - buffers[i].lower);
      break;
    case Order::kLowerAsc:
      for (int32_t i = 0; i < n; ++i) key[i] = buffers[i].lower;
      break;
    case Order::kConflictDesc: {
      // The largest live total over the buffer's lifetime (its "pressure").
      const auto profile = live_profile(buffers);
      std::vector<Time> times(profile.size());
      std::vector<Offset> live(profile.size());
      for (size_t k = 0; k < profile.size(); ++k) {
        times[k] = profile[k].first;
        live[k] = profile[k].second;
      }
      // Sparse table for range max over the profile.
      const size_t m = live.size();
      std::vector<std::vector<Offset>> table{live};
      for (size_t w = 1; (size_t(1) << w) <= m; ++w) {
        const auto& prev = table.back();
        std::vector<Offset> next(m - (size_t(1) << w) + 1);
        for (size_t k = 0; k < next.size(); ++k) next[k] = std::max(prev[k], prev[k + (size_t(1) << (w - 1))]);
        table.push_back(std::move(next));
      }
      for (int32_t i = 0; i < n; ++i) {
        const size_t l = std::lower_bound(times.begin(), times.end(), buffers[i].lower) - times.begin();
        const size_t r = std::lower_bound(times.begin(), times.end(), buffers[i].upper) - times.begin();
        size_t w = 0;
        while ((size_t(2) << w) <= r - l) ++w;
        key[i] = -std::max(table[w][l], table[w][r - (size_t(1) << w)]);
      }
      break;
    }
  }
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    if (key[a] != key[b]) return key[a] < key[b];
    if (buffers[a].size != buffers[b].size) return buffers[a].size > buffers[b].size;
    return false;
  });
  return idx;
}

std::vector<Offset> place_greedy(const std::vector<Buffer>& buffers) {
  return place_best_fit(buffers, make_order(buffers, Order::kSizeDesc));
}

}  // namespace torchmem::planner
