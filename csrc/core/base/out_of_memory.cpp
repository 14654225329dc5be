#include "core/base/out_of_memory.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace torchmem {

std::string hex_address(uintptr_t addr) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(addr));
  return buf;
}

std::string format_size(size_t bytes) {
  char buf[64];
  if (bytes <= 1024) {
    std::snprintf(buf, sizeof buf, "%zu bytes", bytes);
  } else if (bytes <= 1048576) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", bytes / 1024.0);
  } else if (bytes <= 1073741824) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / 1048576.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / 1073741824.0);
  }
  return buf;
}

std::string oom_message_head(const std::string& device_name, const OomInfo& info, bool limited) {
  std::ostringstream msg;
  msg << device_name << " out of memory. Tried to allocate " << format_size(info.alloc_size) << ". Device "
      << device_name << " has a total capacity of " << format_size(info.device_total) << " of which "
      << format_size(info.device_free) << " is free. "
      << (limited ? format_size(info.allowed) + " allowed; " : std::string()) << "Of the allocated memory "
      << format_size(info.allocated) << " is allocated by PyTorch, and "
      << format_size(info.reserved - std::min(info.reserved, info.allocated))
      << " is reserved by PyTorch but unallocated";
  return msg.str();
}

}  // namespace torchmem
