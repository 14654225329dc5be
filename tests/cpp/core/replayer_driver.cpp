// Core driver: replayer (tests/cpp/core_driver.cpp runs it).
#include "core_checks.h"

namespace core_driver {

namespace {

// Replayer

void test_replayer() {
  // Bad events: the error names the event; with skip_bad_events they are counted.
  for (bool skip : {false, true}) {
    Replayer r(1 * GiB, 0, AllocatorConfig{}, 1, skip);
    const uint8_t ops[] = {0, 1, 1, 0, 0, 250};
    const uint64_t ids[] = {1, 1, 1, 2, 2, 3};
    const uint64_t sizes[] = {4096, 0, 0, 8192, 8192, 1};
    const uint64_t streams[] = {0, 0, 0, 0, 0, 0};
    std::string message;
    if (!skip) {
      CHECK(expect_throw<std::invalid_argument>([&] { r.run(ops, ids, sizes, streams, nullptr, 6); }, &message).empty());
      CHECK_MSG(contains(message, "event 2") && contains(message, "free of id 1"), message);
    } else {
      CHECK(expect_throw<std::invalid_argument>([&] { r.run(ops, ids, sizes, streams, nullptr, 6); }, &message).empty());
      CHECK_MSG(contains(message, "unknown operation code 250"), message);
      CHECK(r.skipped() == 2);
    }
    INVARIANTS(r.allocator());
  }
  // A trace that does not fit stops at the first OOM and records it.
  Replayer r(100 * MiB, 10 * MiB, AllocatorConfig{}, 4, false);
  std::vector<uint8_t> ops;
  std::vector<uint64_t> ids, sizes, streams;
  for (uint64_t i = 0; i < 10; ++i) {
    ops.push_back(0);
    ids.push_back(i);
    sizes.push_back(30 * MiB);
    streams.push_back(0);
  }
  const size_t consumed = r.run(ops.data(), ids.data(), sizes.data(), streams.data(), nullptr, ops.size());
  CHECK(r.stopped() && r.oom() && r.oom()->index == 3 && consumed == 3);
  CHECK(r.run(ops.data(), ids.data(), sizes.data(), streams.data(), nullptr, ops.size()) == 0);
  INVARIANTS(r.allocator());
  // Sizes the device can never hold are an OOM, not a crash.
  Replayer big(1 * GiB, 0, AllocatorConfig{}, 1, false);
  const uint8_t op = 0;
  const uint64_t id = 1, huge = std::numeric_limits<uint64_t>::max(), stream = 0;
  big.run(&op, &id, &huge, &stream, nullptr, 1);
  CHECK(big.stopped());
  CHECK_THROWS(std::invalid_argument, Replayer(1 * GiB, 2 * GiB, AllocatorConfig{}, 1, false));
}

// A recorded run replayed from its midpoint: the state then restored, the rest
// of the history turned into events (recorded addresses, releases), every
// placement compared. Then restore_segment's bad input.
void test_replayer_follows_recording() {
  for (const char* conf : {"", "max_split_size_mb:24", "expandable_segments:True"}) {
    SimDevice device(4 * GiB);
    CachingAllocator a(device, AllocatorConfig::parse(conf));
    std::mt19937_64 rng(11);
    std::vector<void*> live;
    auto step = [&] {
      if (!live.empty() && rng() % 100 < 45) {
        const size_t k = rng() % live.size();
        a.deallocate(live[k]);
        live[k] = live.back();
        live.pop_back();
      } else if (rng() % 200 == 0) {
        a.empty_cache();
      } else {
        const size_t kinds[] = {700, 70000, 3 * MiB, 30 * MiB};
        live.push_back(a.allocate(kinds[rng() % 4] + rng() % 4096));
      }
    };
    for (int i = 0; i < 1500; ++i) step();
    const std::vector<SegmentInfo> start = a.segments();
    a.enable_history(1 << 20);
    for (int i = 0; i < 1500; ++i) step();

    Replayer r(4 * GiB, 0, AllocatorConfig::parse(conf), 64, false, true);
    std::unordered_map<uintptr_t, uint64_t> id_of;
    uint64_t next_id = 0;
    RecordedRange ranges[2];  // expandable: one range per pool, beginning at its lowest mapped page
    std::vector<uint64_t> range_ids[2];
    for (const SegmentInfo& seg : start) {
      RecordedSegment rs{seg.addr, seg.total_size, seg.stream, seg.is_small, {}};
      std::vector<uint64_t> ids;
      for (const BlockInfo& b : seg.blocks) {
        if (!b.allocated) continue;
        rs.live_blocks.push_back({b.addr, b.size, b.requested_size});
        ids.push_back(id_of[b.addr] = next_id++);
      }
      if (!seg.is_expandable) {
        r.restore(rs, ids);
        continue;
      }
      RecordedRange& range = ranges[seg.is_small];
      if (range.mapped.empty()) range.base = seg.addr;
      range.is_small = seg.is_small;
      range.mapped.push_back({seg.addr, seg.total_size});
      range.live_blocks.insert(range.live_blocks.end(), rs.live_blocks.begin(), rs.live_blocks.end());
      range_ids[seg.is_small].insert(range_ids[seg.is_small].end(), ids.begin(), ids.end());
    }
    for (int k = 0; k < 2; ++k) {
      if (!ranges[k].mapped.empty()) r.restore_expandable(ranges[k], range_ids[k]);
    }
    INVARIANTS(r.allocator());
    std::vector<uint8_t> ops;
    std::vector<uint64_t> ids, sizes, streams, addrs;
    auto add = [&](ReplayOp op, uint64_t id, uint64_t size, uint64_t addr) {
      ops.push_back(static_cast<uint8_t>(op));
      ids.push_back(id);
      sizes.push_back(size);
      streams.push_back(0);
      addrs.push_back(addr);
    };
    for (const TraceEntry& e : a.history_entries()) {
      switch (e.action) {
        case Action::kAlloc: add(ReplayOp::kAlloc, id_of[e.addr] = next_id++, e.size, e.addr); break;
        case Action::kFreeCompleted: {
          auto it = id_of.find(e.addr);
          if (it != id_of.end()) add(ReplayOp::kFree, it->second, 0, 0);
          if (it != id_of.end()) id_of.erase(it);
          break;
        }
        case Action::kSegmentAlloc: add(ReplayOp::kSegmentAddress, 0, e.size, e.addr); break;
        case Action::kSegmentMap: add(ReplayOp::kSegmentAddress, 0, 0, e.addr); break;
        case Action::kSegmentFree:
        case Action::kSegmentUnmap: add(ReplayOp::kReleaseSegment, 0, e.size, e.addr); break;
        default: break;
      }
    }
    r.run(ops.data(), ids.data(), sizes.data(), streams.data(), addrs.data(), ops.size());
    const ReplayFidelity& f = r.fidelity();
    CHECK_MSG(!r.stopped() && f.placements_differed == 0 && f.segments_missed == 0 && f.releases_missed == 0,
              std::string(conf) + ": first difference at event " + std::to_string(f.first_difference));
    CHECK(f.placements_matched > 500);
    INVARIANTS(r.allocator());
    CHECK(r.allocator().stats().reserved_bytes[kAggregate].current == a.stats().reserved_bytes[kAggregate].current);
  }
  // restore_segment: a bad layout is refused and leaves the allocator as it was.
  Replayer r(1 * GiB, 0, AllocatorConfig{}, 1, false);
  const uintptr_t base = uintptr_t(1) << 44;
  RecordedSegment seg{base, 20 * MiB, 0, false, {{base, 4 * MiB, 3 * MiB}, {base + 2 * MiB, 0, MiB}}};
  CHECK_THROWS(std::invalid_argument, r.restore(seg, {1, 2}));  // overlapping blocks
  CHECK(r.allocator().stats().reserved_bytes[kAggregate].current == 0 && r.device().live_segments() == 0);
  seg.live_blocks = {{base, 0, 3 * MiB}, {base + 4 * MiB, 0, 15 * MiB}};
  r.restore(seg, {1, 2});  // sizes inferred: each absorbs the 1 MiB tail it could not split off
  const std::vector<SegmentInfo> got = r.allocator().segments();
  CHECK(got.size() == 1 && got[0].blocks.size() == 2 && got[0].blocks[0].size == 4 * MiB && got[0].blocks[1].size == 16 * MiB);
  CHECK_THROWS(std::invalid_argument, r.restore(seg, {3, 4}));  // overlaps the segment already there
  CHECK_THROWS(std::invalid_argument, r.restore(RecordedSegment{base + GiB, 2 * GiB, 0, false, {}}, {}));  // too big
  INVARIANTS(r.allocator());
}

// kFreeRequested (a record_stream free): the allocation ends at the request,
// the block stays active and is not reused until the kFree completes it.
void test_replayer_free_requested() {
  Replayer r(1 * GiB, 0, AllocatorConfig{}, 1, false);
  auto run = [&](ReplayOp op, uint64_t id, uint64_t size = 0) {
    const uint8_t o = static_cast<uint8_t>(op);
    const uint64_t stream = 0;
    return r.run(&o, &id, &size, &stream, nullptr, 1);
  };
  run(ReplayOp::kAlloc, 1, 30 * MiB);
  run(ReplayOp::kFreeRequested, 1);
  DeviceStats s = r.stats();
  CHECK(s.allocated_bytes[kAggregate].current == 0 && s.allocation[kAggregate].current == 0);
  CHECK(s.active_bytes[kAggregate].current == static_cast<int64_t>(30 * MiB) && s.active[kAggregate].current == 1);
  CHECK(s.requested_bytes[kAggregate].current == static_cast<int64_t>(30 * MiB));
  run(ReplayOp::kAlloc, 2, 30 * MiB);  // the pending block is not free yet: a second segment
  CHECK(r.allocator().segments().size() == 2);
  run(ReplayOp::kFree, 1);  // free_completed: cached now
  s = r.stats();
  CHECK(s.active_bytes[kAggregate].current == static_cast<int64_t>(30 * MiB) && s.active[kAggregate].current == 1);
  run(ReplayOp::kAlloc, 3, 30 * MiB);  // takes the completed block
  s = r.stats();
  CHECK(r.allocator().segments().size() == 2 && s.reserved_bytes[kAggregate].current == static_cast<int64_t>(60 * MiB));
  CHECK(s.allocated_bytes[kAggregate].peak == static_cast<int64_t>(60 * MiB));  // never 1, 2 and 3 at once
  INVARIANTS(r.allocator());
  // Bad events name themselves; with skip_bad_events they are counted.
  std::string message;
  run(ReplayOp::kFreeRequested, 2);
  CHECK(expect_throw<std::invalid_argument>([&] { run(ReplayOp::kFreeRequested, 2); }, &message).empty());
  CHECK_MSG(contains(message, "free_requested of id 2") && contains(message, "already requested"), message);
  CHECK(expect_throw<std::invalid_argument>([&] { run(ReplayOp::kAlloc, 2, 4096); }, &message).empty());
  CHECK_MSG(contains(message, "already live"), message);
  CHECK(expect_throw<std::invalid_argument>([&] { run(ReplayOp::kFreeRequested, 9); }, &message).empty());
  CHECK_MSG(contains(message, "free_requested of id 9") && contains(message, "not live"), message);
  run(ReplayOp::kFree, 2);
  INVARIANTS(r.allocator());
  Replayer skipping(1 * GiB, 0, AllocatorConfig{}, 1, true);
  const uint8_t ops[] = {0, 8, 8, 8, 1};
  const uint64_t ids[] = {1, 1, 1, 7, 1}, sizes[] = {4096, 0, 0, 0, 0}, streams[] = {0, 0, 0, 0, 0};
  CHECK(skipping.run(ops, ids, sizes, streams, nullptr, 5) == 5 && skipping.skipped() == 2);
  CHECK(skipping.stats().active_bytes[kAggregate].current == 0);
  // A policy without a two-step free (stitch) frees the block at the kFree.
  Replayer stitch(1 * GiB, 0, AllocatorConfig::parse("policy:stitch"), 1, false);
  CHECK(stitch.run(ops, ids, sizes, streams, nullptr, 2) == 2);
  CHECK(stitch.stats().allocated_bytes[kAggregate].current > 0);
  CHECK(stitch.run(ops + 4, ids + 4, sizes + 4, streams + 4, nullptr, 1) == 1);
  CHECK(stitch.stats().allocated_bytes[kAggregate].current == 0);
  INVARIANTS(stitch.allocator());
}

// kFreeAtSync (Note [Frees completed at a release], trace_pass.py): the free
// completes inside the next request's full release, after its search of the
// cache missed, so a block that would fit is not handed to that request.
void test_replayer_free_at_sync() {
  auto replayer = [](ReplayOp free_op) {
    auto r = std::make_unique<Replayer>(100 * MiB, 0, AllocatorConfig{}, 1, false);
    // One 90 MiB segment, split into block 1 (60 MiB) and block 4 (30 MiB); block 1's free waits on a stream.
    const uint8_t ops[] = {0, 1, 0, 0, 8, static_cast<uint8_t>(free_op)};
    const uint64_t ids[] = {0, 0, 1, 4, 1, 1}, sizes[] = {90 * MiB, 0, 60 * MiB, 30 * MiB, 0, 0};
    const uint64_t streams[] = {0, 0, 0, 0, 0, 0};
    CHECK(r->run(ops, ids, sizes, streams, nullptr, 6) == 6 && r->allocator().segments().size() == 1);
    return r;
  };
  auto run = [](Replayer& r, ReplayOp op, uint64_t id, uint64_t size) {
    const uint8_t o = static_cast<uint8_t>(op);
    const uint64_t stream = 0;
    return r.run(&o, &id, &size, &stream, nullptr, 1);
  };
  // Completed at the release: the 20 MiB request finds no cached block, no room for a segment, and fails.
  auto at_sync = replayer(ReplayOp::kFreeAtSync);
  CHECK(at_sync->stats().active_bytes[kAggregate].current == static_cast<int64_t>(90 * MiB));
  run(*at_sync, ReplayOp::kFailedAlloc, 3, 20 * MiB);
  CHECK(at_sync->stopped() && at_sync->fidelity().failed_alloc_succeeded < 0);
  CHECK(at_sync->stats().active_bytes[kAggregate].current == static_cast<int64_t>(30 * MiB));  // completed there
  INVARIANTS(at_sync->allocator());
  // Completed before it (kFree): the request takes block 1, where PyTorch's ran out of memory.
  auto before = replayer(ReplayOp::kFree);
  run(*before, ReplayOp::kFailedAlloc, 3, 20 * MiB);
  CHECK(!before->stopped() && before->fidelity().failed_alloc_succeeded >= 0);
  // A request that makes no full release (a small segment fits): the free completes after it.
  auto small = replayer(ReplayOp::kFreeAtSync);
  run(*small, ReplayOp::kAlloc, 5, 4096);
  CHECK(!small->stopped() && small->allocator().segments().size() == 2);
  CHECK(small->stats().active_bytes[kAggregate].current == static_cast<int64_t>(30 * MiB + 4096));
  INVARIANTS(small->allocator());
  // An id whose free was not requested is freed at once, as at kFree.
  Replayer plain(100 * MiB, 0, AllocatorConfig{}, 1, false);
  run(plain, ReplayOp::kAlloc, 1, 30 * MiB);
  run(plain, ReplayOp::kFreeAtSync, 1, 0);
  CHECK(plain.stats().active_bytes[kAggregate].current == 0);
}

// kRequestRelease (Note [A failed map's own release], trace_pass.py): a
// release the next request makes itself; what it did not make is released
// after it, never before (unlike kReleaseSegment).
void test_replayer_request_release() {
  auto run = [](Replayer& r, ReplayOp op, uint64_t id, uint64_t size, uint64_t stream, uintptr_t addr) {
    const uint8_t o = static_cast<uint8_t>(op);
    const uint64_t a = addr;
    return r.run(&o, &id, &size, &stream, &a, 1);
  };
  for (ReplayOp release : {ReplayOp::kRequestRelease, ReplayOp::kReleaseSegment}) {
    Replayer r(1 * GiB, 0, AllocatorConfig{}, 1, false, true);
    run(r, ReplayOp::kAlloc, 1, 30 * MiB, 0, 0);
    const uintptr_t cached = r.allocator().segments().at(0).addr;
    run(r, ReplayOp::kFree, 1, 0, 0, 0);
    run(r, release, 0, 30 * MiB, 0, cached);
    run(r, ReplayOp::kAlloc, 2, 50 * MiB, 1, 0);  // another stream: a segment of its own
    const DeviceStats s = r.stats();
    CHECK(r.allocator().segments().size() == 1 && r.fidelity().releases_made == 1);
    // Released after the request: both segments were held at once.
    const int64_t peak = static_cast<int64_t>(release == ReplayOp::kRequestRelease ? 80 * MiB : 50 * MiB);
    CHECK(s.reserved_bytes[kAggregate].peak == peak);
    INVARIANTS(r.allocator());
  }
  // Not following the recording, it is ignored.
  Replayer free_run(1 * GiB, 0, AllocatorConfig{}, 1, false, false);
  run(free_run, ReplayOp::kAlloc, 1, 30 * MiB, 0, 0);
  const uintptr_t cached = free_run.allocator().segments().at(0).addr;
  run(free_run, ReplayOp::kFree, 1, 0, 0, 0);
  run(free_run, ReplayOp::kRequestRelease, 0, 30 * MiB, 0, cached);
  run(free_run, ReplayOp::kAlloc, 2, 50 * MiB, 1, 0);
  CHECK(free_run.allocator().segments().size() == 2);
}


// kRecordedRetry: PyTorch searched its cache before the retry's releases, which
// a replay following the recording makes ahead of the request; so the next
// request skips its search and makes a new segment. Only that one request.
void test_replayer_recorded_retry() {
  auto run = [](Replayer& r, ReplayOp op, uint64_t id, uint64_t size) {
    const uint8_t o = static_cast<uint8_t>(op);
    const uint64_t stream = 0;
    return r.run(&o, &id, &size, &stream, nullptr, 1);
  };
  for (bool follow : {true, false}) {
    Replayer r(200 * MiB, 0, AllocatorConfig{}, 1, false, follow);
    // One 90 MiB segment split into block 1 (60 MiB, freed) and block 4 (30 MiB).
    run(r, ReplayOp::kAlloc, 0, 90 * MiB);
    run(r, ReplayOp::kFree, 0, 0);
    run(r, ReplayOp::kAlloc, 1, 60 * MiB);
    run(r, ReplayOp::kAlloc, 4, 30 * MiB);
    run(r, ReplayOp::kFree, 1, 0);
    run(r, ReplayOp::kRecordedRetry, 0, 0);
    run(r, ReplayOp::kAlloc, 3, 20 * MiB);
    // Following the recording: a new segment, and the retry counted; else block 1's space.
    CHECK(r.allocator().segments().size() == (follow ? 2u : 1u));
    CHECK(r.stats().num_alloc_retries == (follow ? 1 : 0));
    run(r, ReplayOp::kAlloc, 5, 20 * MiB);  // the next request searches again: block 1's space
    CHECK(r.allocator().segments().size() == (follow ? 2u : 1u));
    INVARIANTS(r.allocator());
  }
  // A request that makes its own full release counts its retry once: the device refuses a second
  // 60 MiB segment until the one cached on stream 1 goes back.
  Replayer own(100 * MiB, 0, AllocatorConfig{}, 1, false, true);
  const uint8_t ops[] = {0, 1, static_cast<uint8_t>(ReplayOp::kRecordedRetry), 0};
  const uint64_t ids[] = {1, 1, 0, 2}, sizes[] = {60 * MiB, 0, 0, 60 * MiB}, streams[] = {1, 1, 0, 0};
  CHECK(own.run(ops, ids, sizes, streams, nullptr, 4) == 4);
  CHECK(own.stats().num_alloc_retries == 1 && own.allocator().segments().size() == 1);
  INVARIANTS(own.allocator());
}

}  // namespace

std::vector<Test> replayer_tests() {
  return {
      {"replayer", test_replayer},
      {"replayer_follows_recording", test_replayer_follows_recording},
      {"replayer_free_requested", test_replayer_free_requested},
      {"replayer_free_at_sync", test_replayer_free_at_sync},
      {"replayer_request_release", test_replayer_request_release},
      {"replayer_recorded_retry", test_replayer_recorded_retry},
  };
}

}  // namespace core_driver
