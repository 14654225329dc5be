// Checks a placement: every offset >= 0 and no two buffers that overlap in
// time overlap in space. O(n log n) by a sweep over time that keeps the live
// buffers ordered by offset (a conflict always shows between neighbours).
#pragma once

#include <string>
#include <vector>

#include "core/planner/buffers.h"

namespace torchmem::planner {

struct Validation {
  bool ok = true;
  // When !ok: indices (into the buffers vector) of one conflicting pair
  // (second is -1 for a negative offset), and a sentence saying why.
  int64_t first = -1;
  int64_t second = -1;
  std::string message;
};

Validation validate(const std::vector<Buffer>& buffers, const std::vector<Offset>& offsets);

}  // namespace torchmem::planner
