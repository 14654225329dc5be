// Checks the core's C++ drivers share on a FaultyDevice and on host memory
// (core_driver.cpp, stitch_driver.cpp).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "faulty_device.h"
#include "driver_checks.h"

namespace driver {

// The device holds nothing and saw no contract violation.
inline void check_device_clean(const torchmem::FaultyDevice& dev, const char* file, int line) {
  ++g_checks;
  if (!dev.holds_nothing()) {
    report_failure(file, line,
                   "device still holds " + std::to_string(dev.live_segments()) + " segments (" +
                       std::to_string(dev.live_segment_bytes()) + " bytes), " + std::to_string(dev.reserved_ranges()) +
                       " ranges, " + std::to_string(dev.mapped_bytes()) + " mapped bytes");
  }
  for (const std::string& v : dev.violations()) report_failure(file, line, "device contract: " + v);
}

// Memory patterns: on host devices every live block carries a tag, written on
// allocation and checked on free, so an overlap or a stray write shows.
inline void fill(uintptr_t addr, size_t size, uint8_t tag) {
  auto* p = reinterpret_cast<uint8_t*>(addr);
  if (size <= 64 * KiB) {
    std::memset(p, tag, size);
  } else {  // the ends and the middle
    std::memset(p, tag, 4 * KiB);
    std::memset(p + size / 2 - 2 * KiB, tag, 4 * KiB);
    std::memset(p + size - 4 * KiB, tag, 4 * KiB);
  }
}

inline bool intact(uintptr_t addr, size_t size, uint8_t tag) {
  auto* p = reinterpret_cast<const uint8_t*>(addr);
  auto range_ok = [&](size_t off, size_t n) {
    for (size_t i = 0; i < n; ++i)
      if (p[off + i] != tag) return false;
    return true;
  };
  if (size <= 64 * KiB) return range_ok(0, size);
  return range_ok(0, 4 * KiB) && range_ok(size / 2 - 2 * KiB, 4 * KiB) && range_ok(size - 4 * KiB, 4 * KiB);
}

}  // namespace driver

#define DEVICE_CLEAN(dev) ::driver::check_device_clean((dev), __FILE__, __LINE__)
