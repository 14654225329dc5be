#include "core/planner/preorder.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace torchmem::planner {

namespace {

// Max over each buffer's sections of the bytes live in that section.
std::vector<int64_t> pressures(const std::vector<Buffer>& buffers, const Sections& s) {
  const int32_t count = s.count();
  std::vector<int64_t> diff(count + 1, 0);
  for (size_t i = 0; i < buffers.size(); ++i) {
    diff[s.first[i]] += buffers[i].size;
    diff[s.last[i]] -= buffers[i].size;
  }
  std::vector<int64_t> live(std::max(count, 1), 0);
  int64_t run = 0;
  for (int32_t k = 0; k < count; ++k) live[k] = (run += diff[k]);
  // Sparse table range max.
  std::vector<std::vector<int64_t>> table{live};
  for (size_t w = 1; (size_t(1) << w) <= live.size(); ++w) {
    const auto& prev = table.back();
    std::vector<int64_t> next(live.size() - (size_t(1) << w) + 1);
    for (size_t k = 0; k < next.size(); ++k) next[k] = std::max(prev[k], prev[k + (size_t(1) << (w - 1))]);
    table.push_back(std::move(next));
  }
  std::vector<int64_t> out(buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    const size_t l = s.first[i], r = s.last[i];
    size_t w = 0;
    while ((size_t(2) << w) <= r - l) ++w;
    out[i] = std::max(table[w][l], table[w][r - (size_t(1) << w)]);
  }
  return out;
}

}  // namespace

std::vector<int32_t> preorder(const std::vector<Buffer>& buffers, const Sections& sections,
                              const std::string& keys) {
  const size_t n = buffers.size();
  std::vector<std::vector<double>> columns;
  for (char c : keys) {
    std::vector<double> col(n);
    switch (c) {
      case 'T': {
        const auto p = pressures(buffers, sections);
        for (size_t i = 0; i < n; ++i) col[i] = double(p[i]);
        break;
      }
      case 'P': {
        const auto p = pressures(buffers, sections);
        const int64_t peak = p.empty() ? 0 : *std::max_element(p.begin(), p.end());
        for (size_t i = 0; i < n; ++i) col[i] = p[i] == peak ? 1 : 0;
        break;
      }
      case 'W':
        for (size_t i = 0; i < n; ++i) col[i] = double(sections.last[i] - sections.first[i]);
        break;
      case 'A':
        for (size_t i = 0; i < n; ++i) col[i] = double(buffers[i].size) * double(buffers[i].upper - buffers[i].lower);
        break;
      case 'Z':
        for (size_t i = 0; i < n; ++i) col[i] = double(buffers[i].size);
        break;
      case 'L':
        for (size_t i = 0; i < n; ++i) col[i] = double(buffers[i].upper - buffers[i].lower);
        break;
      case 'H':
      case 'Q': {
        // Long-lived: alive for at least half (H) or a tenth (Q) of the horizon.
        Time t0 = 0, t1 = 0;
        if (n > 0) {
          t0 = buffers[0].lower;
          t1 = buffers[0].upper;
          for (const Buffer& b : buffers) {
            t0 = std::min(t0, b.lower);
            t1 = std::max(t1, b.upper);
          }
        }
        const double horizon = double(t1 - t0) * (c == 'H' ? 0.5 : 0.1);
        for (size_t i = 0; i < n; ++i) col[i] = double(buffers[i].upper - buffers[i].lower) >= horizon ? 1 : 0;
        break;
      }
      default:
        throw std::invalid_argument(std::string("unknown preorder key '") + c + "'");
    }
    columns.push_back(std::move(col));
  }
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    for (const auto& col : columns) {
      if (col[a] != col[b]) return col[a] > col[b];
    }
    return a < b;
  });
  return order;
}

std::vector<int32_t> ranks_of(const std::vector<int32_t>& order) {
  std::vector<int32_t> rank(order.size());
  for (size_t i = 0; i < order.size(); ++i) rank[order[i]] = int32_t(i);
  return rank;
}

}  // namespace torchmem::planner
