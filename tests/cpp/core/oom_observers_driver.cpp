// Core driver: oom observers (tests/cpp/core_driver.cpp runs it).
#include "core_checks.h"

namespace core_driver {

namespace {

// OOM observers: notes in order, failures reported and never thrown, an OOM
// inside an observer not reported again, changes during a notify, threads,
// and the glue's pattern (notify after the allocator's OutOfMemory left it,
// so an observer can read the allocator's segments and history).

void test_oom_observers() {
  OomObservers obs;
  OomInfo info;
  info.requested = 3 * MiB;
  CHECK(obs.empty());
  CHECK(obs.notify(0, info).empty());
  const uint64_t a = obs.add([](int device, const OomInfo& i) { return "a " + std::to_string(device) + " " + std::to_string(i.requested); });
  const uint64_t b = obs.add([](int, const OomInfo&) { return std::string(); });
  const uint64_t c = obs.add([](int, const OomInfo&) -> std::string { throw std::runtime_error("disk full"); });
  const uint64_t d = obs.add([](int, const OomInfo&) { return std::string("d"); });
  CHECK(!obs.empty());
  std::string notes = obs.notify(2, info);
  CHECK_MSG(notes == "\na 2 " + std::to_string(3 * MiB) + "\ntorchmem: an out-of-memory observer failed: disk full\nd", notes);
  CHECK(obs.remove(c));
  CHECK(!obs.remove(c));
  CHECK(obs.remove(b));
  CHECK_MSG(obs.notify(0, info) == "\na 0 " + std::to_string(3 * MiB) + "\nd", obs.notify(0, info));
  CHECK(obs.remove(a) && obs.remove(d) && obs.empty());

  // Re-entry on the same thread (an OOM inside an observer) is not reported again.
  int calls = 0;
  const uint64_t r = obs.add([&](int, const OomInfo& i) {
    ++calls;
    return "outer(" + obs.notify(0, i) + ")";
  });
  CHECK_MSG(obs.notify(0, info) == "\nouter()", obs.notify(0, info));
  CHECK(calls == 1);
  obs.remove(r);

  // An observer may add and remove observers: the change applies from the next notify.
  uint64_t self = 0;
  self = obs.add([&](int, const OomInfo&) {
    obs.remove(self);
    obs.add([](int, const OomInfo&) { return std::string("late"); });
    return std::string("once");
  });
  CHECK(obs.notify(0, info) == "\nonce");
  CHECK(obs.notify(0, info) == "\nlate");
}

void test_oom_observers_threads() {
  OomObservers obs;
  std::atomic<int> told{0};
  std::atomic<bool> stop{false};
  obs.add([&](int, const OomInfo&) {
    told.fetch_add(1);
    return std::string("x");
  });
  std::vector<std::thread> threads;
  const int rounds = scaled(20000, 2000);
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&] {
      OomInfo info;
      for (int i = 0; i < rounds; ++i) {
        const std::string notes = obs.notify(0, info);
        if (notes.rfind("\nx", 0) != 0) CHECK_MSG(false, notes);
      }
    });
  }
  threads.emplace_back([&] {
    while (!stop.load()) {
      const uint64_t id = obs.add([](int, const OomInfo&) { return std::string("y"); });
      obs.remove(id);
    }
  });
  for (int t = 0; t < 3; ++t) threads[t].join();
  stop = true;
  threads.back().join();
  CHECK(told.load() == 3 * rounds);
}

void test_oom_observers_after_allocator_oom() {
  SimDevice dev(64 * MiB);
  CachingAllocator a(dev);
  a.enable_history(1000);
  void* keep = a.allocate(40 * MiB);
  OomObservers obs;
  size_t seen_segments = 0;
  TraceEntry last{};
  obs.add([&](int, const OomInfo& info) {
    seen_segments = a.segments().size();  // takes the allocator's lock: must not be held now
    const auto entries = a.history_entries();
    if (!entries.empty()) last = entries.back();
    return "snapshot taken, " + format_size(info.requested) + " refused";
  });
  std::string message;
  try {
    a.allocate(40 * MiB);
  } catch (const OutOfMemory& e) {
    message = std::string(e.what()) + obs.notify(0, e.info());
  }
  CHECK_MSG(contains(message, "out of memory. Tried to allocate 40.00 MiB") &&
                contains(message, "\nsnapshot taken, 40.00 MiB refused"),
            message);
  CHECK(seen_segments == 1);
  CHECK(last.action == Action::kOom && last.size == 40 * MiB && last.addr == 24 * MiB);  // addr: device_free
  a.deallocate(keep);
  INVARIANTS(a);
}

}  // namespace

std::vector<Test> oom_observers_tests() {
  return {
      {"oom_observers", test_oom_observers},
      {"oom_observers_threads", test_oom_observers_threads},
      {"oom_observers_after_allocator_oom", test_oom_observers_after_allocator_oom},
  };
}

}  // namespace core_driver
