#include "core/base/alloc_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

#include "core/base/policy_registry.h"

namespace torchmem {

namespace {

const char* kKeys =
    "large_segment_size_mb, max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, "
    "garbage_collection_threshold, expandable_segments, per_process_memory_fraction, backend, "
    "release_lock_on_cudamalloc, pinned_* and the other keys of PyTorch's pinned allocator, capacity, policy, "
    "reuse_order, min_block_size";

constexpr size_t kMB = 1024 * 1024;
constexpr size_t kMaxPinnedRegisterThreads = 128;  // CUDAAllocatorConfig::pinned_max_register_threads

bool is_power_of_two(size_t v) { return v != 0 && (v & (v - 1)) == 0; }
size_t log2_floor(size_t v) { return 63 - __builtin_clzll(v); }

[[noreturn]] void fail(const std::string& key, const std::string& value, const std::string& allowed) {
  throw std::invalid_argument("allocator config: bad value '" + value + "' for " + key + ": " + allowed);
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\n");
  size_t e = s.find_last_not_of(" \t\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// Splits "a:b,c:[d:e,f:g]" into top-level "key:value" items. One trailing
// comma is allowed, as in PyTorch; any other empty item is an error there
// ("Unrecognized key ','"), and here.
std::vector<std::string> split_items(const std::string& text) {
  std::vector<std::string> items;
  std::string cur;
  int depth = 0;
  for (char c : text) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) throw std::invalid_argument("allocator config: unbalanced ']' in '" + text + "'");
    if (c == ',' && depth == 0) {
      items.push_back(trim(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (depth != 0) throw std::invalid_argument("allocator config: unbalanced '[' in '" + text + "'");
  items.push_back(trim(cur));
  if (items.size() > 1 && items.back().empty()) items.pop_back();
  for (const std::string& item : items) {
    if (item.empty()) throw std::invalid_argument("allocator config: empty item in '" + text + "'");
  }
  return items;
}

double parse_number(const std::string& key, const std::string& value, const std::string& allowed) {
  try {
    size_t used = 0;
    double v = std::stod(value, &used);
    if (used != value.size() || !std::isfinite(v)) fail(key, value, allowed);
    return v;
  } catch (const std::logic_error&) {
    fail(key, value, allowed);
  }
}

// A whole number that fits 64 bits (PyTorch: ConfigTokenizer::toSizeT).
size_t parse_count(const std::string& key, const std::string& value, const std::string& allowed) {
  if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos) fail(key, value, allowed);
  try {
    return std::stoull(value);
  } catch (const std::out_of_range&) {
    fail(key, value, allowed);
  }
}

// PyTorch's ConfigTokenizer::toBool takes exactly "True" and "False".
bool parse_bool(const std::string& key, const std::string& value) {
  if (value == "True") return true;
  if (value == "False") return false;
  fail(key, value, "expected True or False (PyTorch takes no other spelling)");
}

// AcceleratorAllocatorConfig::parseRoundUpPower2Divisions. A single value
// applies to every interval; a list gives, per power-of-two interval in MB,
// the divisions from that interval on: the first entry also covers every
// interval below it, and ">" every interval after the last one named (or
// after the first interval when none is named before it).
void parse_divisions(AllocatorConfig& c, const std::string& value) {
  const std::string key = "roundup_power2_divisions";
  const std::string allowed = "a power of two, or a list like [256:1,512:2,>:8] of MB:divisions (0 or a power of two)";
  auto& d = c.roundup_power2_divisions;
  if (value.empty() || value.front() != '[') {
    size_t v = parse_count(key, value, allowed);
    if (!is_power_of_two(v)) fail(key, value, allowed);
    d.fill(v);
    return;
  }
  if (value.back() != ']') fail(key, value, allowed);
  const std::string inner = trim(value.substr(1, value.size() - 2));
  if (inner.empty()) return;  // "[]": no rounding, as PyTorch
  bool first = true;
  size_t last_index = 0;
  for (const std::string& item : split_items(inner)) {
    size_t colon = item.find(':');
    if (colon == std::string::npos) fail(key, value, allowed);
    std::string interval = trim(item.substr(0, colon));
    size_t divisions = parse_count(key, trim(item.substr(colon + 1)), allowed);
    if (divisions != 0 && !is_power_of_two(divisions)) fail(key, value, allowed);
    if (interval == ">") {
      for (size_t i = last_index + 1; i < d.size(); ++i) d[i] = divisions;
      continue;
    }
    size_t mb = parse_count(key, interval, allowed);
    if (!is_power_of_two(mb)) fail(key, value, "list intervals must be powers of two (MB)");
    size_t index = std::min(log2_floor(mb), d.size() - 1);
    if (first) {
      for (size_t i = 0; i < index; ++i) d[i] = divisions;
      first = false;
    }
    d[index] = divisions;
    last_index = index;
  }
}

// max_split_size_mb and max_non_split_rounding_mb: at least the large
// segment size (AcceleratorAllocatorConfig::parseMaxSplitSize), at most what
// fits in bytes.
size_t parse_mb_at_least(const std::string& key, const std::string& value, size_t least_bytes) {
  const std::string allowed = "a whole number of MB, at least " + std::to_string(least_bytes / kMB) +
                              " (the large segment size, large_segment_size_mb)";
  size_t mb = parse_count(key, value, allowed);
  if (mb < least_bytes / kMB) fail(key, value, allowed);
  return std::min(mb, std::numeric_limits<size_t>::max() / kMB) * kMB;
}

}  // namespace

std::vector<std::string> config_items(const std::string& text) { return split_items(text); }

size_t parse_size(const std::string& text) {
  const std::string allowed = "a size such as 80GiB, 512MB, 1.5GB or a byte count";
  std::string s = trim(text);
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) fail("size", text, allowed);
  double number = parse_number("size", s.substr(0, i), allowed);
  std::string unit = trim(s.substr(i));
  for (auto& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  double scale;
  if (unit.empty() || unit == "b") scale = 1;
  else if (unit == "kb") scale = 1e3;
  else if (unit == "mb") scale = 1e6;
  else if (unit == "gb") scale = 1e9;
  else if (unit == "tb") scale = 1e12;
  else if (unit == "kib" || unit == "k") scale = 1024.0;
  else if (unit == "mib" || unit == "m") scale = 1024.0 * 1024;
  else if (unit == "gib" || unit == "g") scale = 1024.0 * 1024 * 1024;
  else if (unit == "tib" || unit == "t") scale = 1024.0 * 1024 * 1024 * 1024;
  else fail("size", text, allowed);
  double bytes = number * scale;
  if (bytes >= 9.2e18) fail("size", text, "at most 8 EiB");
  return static_cast<size_t>(std::llround(bytes));
}

AllocatorConfig AllocatorConfig::parse(const std::string& text) {
  AllocatorConfig c;
  if (trim(text).empty()) return c;
  std::vector<std::pair<std::string, std::string>> items;
  for (const std::string& item : split_items(text)) {
    size_t colon = item.find(':');
    if (colon == std::string::npos) {
      throw std::invalid_argument("allocator config: '" + item + "' is not key:value (keys: " + kKeys + ")");
    }
    items.emplace_back(trim(item.substr(0, colon)), trim(item.substr(colon + 1)));
  }
  // large_segment_size_mb first, wherever it stands: it is the default of
  // max_non_split_rounding and the least max_split_size (as PyTorch's parseArgs).
  for (const auto& [key, value] : items) {
    if (key != "large_segment_size_mb") continue;
    const std::string allowed = "a whole number of MB greater than " + std::to_string(kMinLargeAlloc / kMB);
    size_t mb = parse_count(key, value, allowed);
    if (mb <= kMinLargeAlloc / kMB) fail(key, value, allowed);
    c.large_segment_size = std::min(mb, std::numeric_limits<size_t>::max() / kMB) * kMB;
  }
  c.max_non_split_rounding = c.large_segment_size;
  for (const auto& [key, value] : items) {
    if (key == "large_segment_size_mb") {
      // done above
    } else if (key == "max_split_size_mb") {
      c.max_split_size = parse_mb_at_least(key, value, c.large_segment_size);
    } else if (key == "max_non_split_rounding_mb") {
      c.max_non_split_rounding = parse_mb_at_least(key, value, c.large_segment_size);
    } else if (key == "roundup_power2_divisions") {
      parse_divisions(c, value);
    } else if (key == "garbage_collection_threshold") {
      const std::string allowed = "a number strictly between 0.0 and 1.0";
      double v = parse_number(key, value, allowed);
      if (!(v > 0.0 && v < 1.0)) fail(key, value, allowed);
      c.garbage_collection_threshold = v;
    } else if (key == "expandable_segments") {
      c.expandable_segments = parse_bool(key, value);
    } else if (key == "per_process_memory_fraction") {
      const std::string allowed = "a number in [0.0, 1.0]";
      double v = parse_number(key, value, allowed);
      if (!(v >= 0.0 && v <= 1.0)) fail(key, value, allowed);
      c.per_process_memory_fraction = v;
    } else if (key == "backend") {
      if (value != "native") fail(key, value, "torchmem implements the native backend only");
    } else if (key == "release_lock_on_cudamalloc" || key == "release_lock_on_hipmalloc" ||
               key == "pinned_use_background_threads" || key == "pinned_use_cuda_host_register" ||
               key == "pinned_use_hip_host_register" || key == "pinned_free_catch_all" ||
               key == "graph_capture_record_stream_reuse" || key == "throw_on_cudamalloc_oom") {
      parse_bool(key, value);
    } else if (key == "pinned_max_round_threshold_mb" || key == "pinned_max_cached_size_mb") {
      parse_count(key, value, "a whole number of MB");
    } else if (key == "pinned_num_register_threads") {
      const std::string allowed = "a power of two, at most " + std::to_string(kMaxPinnedRegisterThreads);
      size_t v = parse_count(key, value, allowed);
      if (!is_power_of_two(v) || v > kMaxPinnedRegisterThreads) fail(key, value, allowed);
    } else if (key == "pinned_reserve_segment_size_mb") {
      const std::string allowed = "a whole number of MB greater than 0";
      if (parse_count(key, value, allowed) == 0) fail(key, value, allowed);
    } else if (key == "policy") {
      if (find_policy(value) == nullptr) fail(key, value, policy_choices());
      c.policy = value;
    } else if (key == "capacity") {
      c.capacity = parse_size(value);
      if (c.capacity == 0) fail(key, value, "a size greater than zero");
    } else if (key == "reuse_order") {
      if (value == "address") c.reuse_order = ReuseOrder::kAddress;
      else if (value == "recent") c.reuse_order = ReuseOrder::kRecent;
      else if (value == "segment") c.reuse_order = ReuseOrder::kSegment;
      else fail(key, value, "address (lowest address first among equal sizes, native), recent (most recently freed first) "
                            "or segment (oldest segment first, then lowest address: native from torch 2.14)");
    } else if (key == "min_block_size") {
      const std::string allowed = "a power of two number of bytes from " + std::to_string(kMinCpuBlockSize) + " to " +
                                  std::to_string(kMinBlockSize) + " (native: " + std::to_string(kMinBlockSize) + ")";
      const size_t v = parse_count(key, value, allowed);
      if (!is_power_of_two(v) || v < kMinCpuBlockSize || v > kMinBlockSize) fail(key, value, allowed);
      c.min_block_size = v;
    } else {
      throw std::invalid_argument("allocator config: unknown key '" + key + "' (keys: " + kKeys + ")");
    }
  }
  return c;
}

size_t AllocatorConfig::divisions_for(size_t size) const {
  const size_t interval_start = log2_floor(kSmallSize);
  size_t log_size = log2_floor(size);
  size_t index = log_size > interval_start ? log_size - interval_start : 0;
  return roundup_power2_divisions[std::min(index, kRoundUpPowerOfTwoIntervals - 1)];
}

std::string AllocatorConfig::to_string() const {
  AllocatorConfig defaults;
  std::ostringstream out;
  const char* sep = "";
  auto item = [&](const std::string& key, const std::string& value) {
    out << sep << key << ':' << value;
    sep = ",";
  };
  if (large_segment_size != defaults.large_segment_size)
    item("large_segment_size_mb", std::to_string(large_segment_size / kMB));
  if (max_split_size != defaults.max_split_size) item("max_split_size_mb", std::to_string(max_split_size / kMB));
  if (max_non_split_rounding != large_segment_size)
    item("max_non_split_rounding_mb", std::to_string(max_non_split_rounding / kMB));
  if (roundup_power2_divisions != defaults.roundup_power2_divisions) {
    std::string list = "[";
    for (size_t i = 0; i < roundup_power2_divisions.size(); ++i) {
      list += (i ? "," : "") + std::to_string(size_t(1) << i) + ":" + std::to_string(roundup_power2_divisions[i]);
    }
    item("roundup_power2_divisions", list + "]");
  }
  if (garbage_collection_threshold != 0.0) item("garbage_collection_threshold", std::to_string(garbage_collection_threshold));
  if (expandable_segments) item("expandable_segments", "True");
  if (per_process_memory_fraction != 1.0) item("per_process_memory_fraction", std::to_string(per_process_memory_fraction));
  if (capacity != 0) item("capacity", std::to_string(capacity));
  if (policy != kNativePolicy) item("policy", policy);
  if (reuse_order == ReuseOrder::kRecent) item("reuse_order", "recent");
  if (reuse_order == ReuseOrder::kSegment) item("reuse_order", "segment");
  if (min_block_size != kMinBlockSize) item("min_block_size", std::to_string(min_block_size));
  return out.str();
}

size_t allocation_size(size_t size, size_t large_segment_size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return large_segment_size;
  return (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

namespace {

size_t round_up_pow2(size_t n, size_t m) { return (n + m - 1) & ~(m - 1); }

// The next multiple of power_of_two_floor(size) / divisions at or above size.
size_t roundup_power2_next_division(size_t size, size_t divisions) {
  if ((size & (size - 1)) == 0) return size;
  const size_t floor = size_t(1) << log2_floor(size);
  const size_t step = floor / divisions;
  if (step == 0) return floor << 1;
  const size_t rounded_floor = size & ~(step - 1);
  return rounded_floor == size ? size : rounded_floor + step;
}

}  // namespace

size_t round_request(size_t size, const AllocatorConfig& c) {
  if (size < c.min_block_size) return c.min_block_size;
  const size_t divisions = c.divisions_for(size);
  if (divisions > 1 && size > kMinBlockSize * divisions) return roundup_power2_next_division(size, divisions);
  return round_up_pow2(size, c.min_block_size);
}

size_t expandable_pages(size_t device_bytes, size_t page) {
  const size_t reach = device_bytes + device_bytes / 8;
  return reach / page + (reach % page != 0);
}

}  // namespace torchmem
