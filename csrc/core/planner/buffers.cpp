#include "core/planner/buffers.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace torchmem::planner {

void check_buffers(const std::vector<Buffer>& buffers) {
  for (size_t i = 0; i < buffers.size(); ++i) {
    const Buffer& b = buffers[i];
    if (b.size < 0) {
      throw std::invalid_argument("buffer " + std::to_string(b.id) + " has negative size " +
                                  std::to_string(b.size));
    }
    if (b.lower >= b.upper) {
      throw std::invalid_argument("buffer " + std::to_string(b.id) + " has lower " +
                                  std::to_string(b.lower) + " >= upper " + std::to_string(b.upper));
    }
  }
}

Offset height_of(const std::vector<Buffer>& buffers, const std::vector<Offset>& offsets) {
  Offset height = 0;
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i].size > 0) height = std::max(height, offsets[i] + buffers[i].size);
  }
  return height;
}

std::vector<Buffer> pad_sizes(const std::vector<Buffer>& buffers, int64_t alignment) {
  if (alignment < 1) throw std::invalid_argument("alignment must be >= 1");
  std::vector<Buffer> padded = buffers;
  if (alignment == 1) return padded;
  for (Buffer& b : padded) b.size = (b.size + alignment - 1) / alignment * alignment;
  return padded;
}

int64_t size_granularity(const std::vector<Buffer>& buffers) {
  int64_t g = 0;
  for (const Buffer& b : buffers) g = std::gcd(g, b.size);
  return g == 0 ? 1 : g;
}

}  // namespace torchmem::planner
