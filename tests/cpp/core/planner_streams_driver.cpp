// Core driver: planner streams (tests/cpp/core_driver.cpp runs it).
#include "core_checks.h"

namespace core_driver {

namespace {

using planner::Buffer;
using planner::Offset;

// Planner with streams. A brute-force happens-before (a fixpoint over the
// syncs, independent of the vector clocks of streams.cpp) decides which
// buffers can be live at once: A and B can, unless every use of one happens
// before the other's producer.

using planner::Sync;
using planner::Time;

bool brute_before(const std::vector<Sync>& syncs, int32_t s, Time u, int32_t x, Time t) {
  if (s == x) return u < t;
  std::map<int32_t, Time> reach;  // stream -> first step from which it knows (events after it carry it)
  reach[s] = u;
  for (bool changed = true; changed;) {
    changed = false;
    for (const Sync& y : syncs) {
      const auto from = reach.find(y.from);
      if (from == reach.end() || y.after < from->second) continue;
      const auto to = reach.find(y.to);
      if (to == reach.end() || y.before < to->second) {
        reach[y.to] = y.before;
        changed = true;
      }
    }
  }
  const auto it = reach.find(x);
  return it != reach.end() && it->second <= t;
}

struct StreamCase {
  std::vector<Buffer> buffers;
  planner::StreamSchedule schedule;
};

std::vector<std::pair<int32_t, Time>> uses_of(const StreamCase& c, size_t b) {
  std::vector<std::pair<int32_t, Time>> out = {{c.schedule.home_of(b), c.buffers[b].lower},
                                               {c.schedule.home_of(b), c.buffers[b].upper - 1}};
  for (const auto& r : c.schedule.reads)
    if (size_t(r.buffer) == b) out.emplace_back(r.stream, r.step);
  return out;
}

bool brute_ordered(const StreamCase& c, size_t a, size_t b) {  // every use of a before b's producer
  for (const auto& [s, u] : uses_of(c, a))
    if (!brute_before(c.schedule.syncs, s, u, c.schedule.home_of(b), c.buffers[b].lower)) return false;
  return true;
}

bool brute_live_at_once(const StreamCase& c, size_t a, size_t b) {
  return c.buffers[a].size > 0 && c.buffers[b].size > 0 && !brute_ordered(c, a, b) && !brute_ordered(c, b, a);
}

bool brute_valid_streams(const StreamCase& c, const std::vector<Offset>& off) {
  for (size_t i = 0; i < c.buffers.size(); ++i) {
    if (off[i] < 0) return false;
    for (size_t j = i + 1; j < c.buffers.size(); ++j) {
      const bool space = off[i] < off[j] + c.buffers[j].size && off[j] < off[i] + c.buffers[i].size;
      if (space && brute_live_at_once(c, i, j)) return false;
    }
  }
  return true;
}

// Random streams, syncs and buffers; reads get the syncs they need (from the
// producer before the read, back to the home stream after it) most of the time.
StreamCase random_stream_case(std::mt19937_64& rng, int max_buffers, int32_t streams, bool repair = true) {
  StreamCase c;
  const Time horizon = 30;
  for (int k = int(rng() % 10); k > 0 && streams > 1; --k) {
    const int32_t a = int32_t(rng() % streams), b = int32_t((a + 1 + rng() % (streams - 1)) % streams);
    const Time after = Time(rng() % horizon);
    c.schedule.syncs.push_back({a, after, b, after + 1 + Time(rng() % 8)});
  }
  const int n = int(rng() % (max_buffers + 1));
  for (int i = 0; i < n; ++i) {
    const Time lo = Time(rng() % horizon);
    const int64_t size = rng() % 6 == 0 ? 0 : 1 + int64_t(rng() % (rng() % 3 == 0 ? 512 : 32));
    c.buffers.push_back(Buffer{i, lo, lo + 1 + Time(rng() % 6), size});
    c.schedule.home.push_back(int32_t(rng() % streams));
  }
  for (int i = 0; i < n && streams > 1; ++i) {
    for (int k = int(rng() % 3); k > 0; --k) {
      const int32_t home = c.schedule.home[i];
      const int32_t s = int32_t((home + 1 + rng() % (streams - 1)) % streams);
      const Time step = c.buffers[i].lower + 1 + Time(rng() % 8);
      if (repair && !brute_before(c.schedule.syncs, home, c.buffers[i].lower, s, step))
        c.schedule.syncs.push_back({home, c.buffers[i].lower, s, step});
      c.schedule.reads.push_back({i, s, step});
    }
  }
  if (repair) {
    std::map<std::pair<int32_t, int32_t>, Time> last;  // (buffer, stream) -> last read
    for (const auto& r : c.schedule.reads) {
      auto& t = last[{r.buffer, r.stream}];
      t = std::max(t, r.step);
    }
    for (const auto& [key, step] : last) {
      const int32_t home = c.schedule.home[key.first];
      if (!brute_before(c.schedule.syncs, key.second, step, home, Time(1) << 40))
        c.schedule.syncs.push_back({key.second, step + Time(rng() % 3), home, step + 4 + Time(rng() % 6)});
    }
  }
  return c;
}

void test_planner_streams_random() {
  std::mt19937_64 rng(g_seed * 31);
  const std::vector<std::string> methods = {"naive", "greedy", "sweep", "bottom_up", "portfolio", "auto"};
  const std::vector<std::string> sharings = {"shared", "per_stream", "auto"};
  for (int round = 0; round < scaled(120, 20); ++round) {
    const StreamCase c = random_stream_case(rng, round % 4 == 0 ? 30 : 10, 1 + int32_t(rng() % 3));
    planner::StreamLifetimes life;
    try {
      life = planner::StreamLiveness(c.buffers, c.schedule).lifetimes();
    } catch (const std::exception& e) {
      report_failure(__FILE__, __LINE__, std::string("lifetimes: ") + e.what());
      continue;
    }
    for (size_t b = 0; b < c.buffers.size(); ++b) {
      CHECK(c.buffers[b].upper <= life.bound[b] && life.bound[b] <= life.own[b]);
      CHECK(life.own[b] <= life.shared[b] && life.shared[b] <= life.horizon);
    }
    // The bound's buffers at one step are pairwise live at once: a true bound.
    for (const Buffer& t : c.buffers) {
      std::vector<size_t> at;
      for (size_t b = 0; b < c.buffers.size(); ++b)
        if (c.buffers[b].lower <= t.lower && t.lower < life.bound[b] && c.buffers[b].size > 0) at.push_back(b);
      for (size_t i = 0; i < at.size(); ++i)
        for (size_t j = i + 1; j < at.size(); ++j) CHECK(brute_live_at_once(c, at[i], at[j]));
    }
    for (const std::string& m : methods) {
      for (const std::string& sh : sharings) {
        planner::SolveOptions options;
        options.method = m;
        options.sharing = sh;
        options.time_limit = 0.1;
        options.alignment = rng() % 3 == 0 ? 4 : 1;
        planner::Solution s;
        try {
          s = planner::solve(c.buffers, c.schedule, options);
        } catch (const std::exception& e) {
          report_failure(__FILE__, __LINE__, "solve(" + m + ", " + sh + "): " + e.what());
          continue;
        }
        StreamCase padded = c;
        padded.buffers = planner::pad_sizes(c.buffers, options.alignment);
        CHECK_MSG(brute_valid_streams(padded, s.offsets), "method " + m + ", sharing " + sh);
        CHECK(s.height >= s.lower_bound);
        CHECK(s.height == planner::height_of(padded.buffers, s.offsets));
        if (!c.schedule.single_stream()) CHECK(sh == "auto" ? !s.sharing.empty() : s.sharing == sh);
      }
    }
    // validate_streams() agrees with the brute force on random placements.
    for (int k = 0; k < 6 && !c.buffers.empty(); ++k) {
      std::vector<Offset> off(c.buffers.size());
      for (auto& o : off) o = Offset(rng() % 300);
      const auto v = planner::validate_streams(c.buffers, c.schedule, off);
      CHECK_MSG(v.ok == brute_valid_streams(c, off), v.message);
    }
    // Happens-before agrees with the brute force.
    const planner::HappensBefore hb({0, 1, 2}, c.schedule.syncs);
    for (int k = 0; k < 40; ++k) {
      const int32_t s = int32_t(rng() % 3), x = int32_t(rng() % 3);
      const Time u = Time(rng() % 40), t = Time(rng() % 40);
      CHECK(hb.before(s, u, x, t) == brute_before(c.schedule.syncs, s, u, x, t));
    }
  }
}

void test_planner_streams_bad_input() {
  planner::StreamSchedule s;
  const std::vector<Buffer> bs = {Buffer{0, 0, 2, 8}, Buffer{1, 1, 3, 8}};
  s.home = {0, 1};
  s.reads = {{0, 1, 4}};  // no sync from stream 0 after step 0 reaches it
  CHECK_THROWS(std::invalid_argument, planner::solve(bs, s));
  s.syncs = {{0, 0, 1, 4}};  // now ordered, but nothing syncs back to stream 0
  CHECK_THROWS(std::invalid_argument, planner::solve(bs, s));
  try {
    planner::solve(bs, s);
  } catch (const std::invalid_argument& e) {
    CHECK_MSG(contains(e.what(), "buffer 0") && contains(e.what(), "never be released"), e.what());
  }
  s.syncs.push_back({1, 4, 0, 6});
  CHECK(planner::solve(bs, s).height == 16);
  for (const Sync& bad : {Sync{0, 3, 0, 5}, Sync{0, 5, 1, 5}, Sync{-1, 0, 1, 2}}) {
    planner::StreamSchedule t = s;
    t.syncs.push_back(bad);
    CHECK_THROWS(std::invalid_argument, planner::solve(bs, t));
  }
  planner::StreamSchedule t = s;
  t.reads.push_back({7, 0, 1});
  CHECK_THROWS(std::invalid_argument, planner::solve(bs, t));
  t = s;
  t.reads.push_back({1, 1, 0});  // on its home stream before its producer
  CHECK_THROWS(std::invalid_argument, planner::solve(bs, t));
  t = s;
  t.home = {0};
  CHECK_THROWS(std::invalid_argument, planner::solve(bs, t));
  t = s;
  t.home = {0, -2};
  CHECK_THROWS(std::invalid_argument, planner::solve(bs, t));
  planner::SolveOptions options;
  options.sharing = "sometimes";
  CHECK_THROWS(std::invalid_argument, planner::solve(bs, s, options));
  // The read in flight keeps buffer 0 until the sync back at step 6.
  const auto life = planner::StreamLiveness(bs, s).lifetimes();
  CHECK(life.own[0] == 6 && life.own[1] == 3);
}

planner::PipelineGraph random_graph(std::mt19937_64& rng, int32_t n) {
  planner::PipelineGraph g;
  for (int32_t v = 0; v < n; ++v) {
    g.names.push_back("n" + std::to_string(v));
    g.cost.push_back(double(rng() % 5));
  }
  for (int32_t v = 0; v < n; ++v) {
    if (rng() % 4 == 0) continue;
    planner::GraphBuffer b;
    b.name = "b" + std::to_string(v);
    b.producer = v;
    for (int32_t r = v + 1; r < n; ++r)
      if (rng() % 4 == 0 || r == v + 1) b.readers.push_back(r);
    b.returned = rng() % 7 == 0;
    b.size = 1 + int64_t(rng() % 64);
    for (int32_t r : b.readers) g.edges.emplace_back(v, r);
    g.buffers.push_back(b);
  }
  return g;
}

void test_planner_pipeline() {
  std::mt19937_64 rng(g_seed * 37);
  for (int round = 0; round < scaled(60, 12); ++round) {
    const int32_t n = 2 + int32_t(rng() % 9);
    const planner::PipelineGraph g = random_graph(rng, n);
    const int32_t stages = 1 + int32_t(rng() % std::min(n, 4));
    planner::PipelineOptions options;
    options.stages = stages;
    options.in_flight = 1 + int32_t(rng() % 3);
    options.solve.time_limit = 0.1;
    options.solve.alignment = rng() % 2 ? 1 : 8;
    planner::PipelinePlan p;
    try {
      p = planner::plan_pipeline(g, options);
    } catch (const std::exception& e) {
      report_failure(__FILE__, __LINE__, std::string("plan_pipeline: ") + e.what());
      continue;
    }
    Offset sum = 0, bounds = 0;
    for (const auto& s : p.stage) {
      sum += s.plan.height;
      bounds += s.plan.lower_bound;
    }
    CHECK(p.height == sum + p.slot_bytes && p.lower_bound == bounds + p.slot_bytes && p.height >= p.lower_bound);
    CHECK(p.speedup >= 1 - 1e-9 && p.speedup <= stages + 1e-9);
    for (size_t v = 1; v < p.stage_of.size(); ++v) CHECK(p.stage_of[v - 1] <= p.stage_of[v]);
    for (const auto& slot : p.slots) CHECK(slot.copies == slot.to_stage - slot.from_stage + options.in_flight - 1);
    // The steady state, checked by brute force; a copy moved onto its neighbour must fail.
    const auto run = planner::unroll_pipeline(g, p, planner::steady_items(p));
    StreamCase c{run.buffers, run.schedule};
    if (run.buffers.size() <= 120) CHECK(brute_valid_streams(c, run.offsets));
    CHECK(planner::validate_streams(run.buffers, run.schedule, run.offsets).ok);
    for (const auto& slot : p.slots) {
      if (slot.size == 0 || slot.copies < 2) continue;
      std::vector<Offset> bad = run.offsets;
      const size_t nb = g.buffers.size();
      bad[nb + size_t(slot.buffer)] = bad[size_t(slot.buffer)];  // item 1 into item 0's copy
      CHECK(!planner::validate_streams(run.buffers, run.schedule, bad).ok);
      break;
    }
    // With in_flight >= 2, the stages of one slot are unordered: all busy.
    if (options.in_flight >= 2 && stages >= 2) {
      const int32_t slot = stages;  // stage k works on item slot - k
      for (int32_t k = 0; k < stages; ++k)
        for (int32_t j = 0; j < stages; ++j) {
          if (k == j) continue;
          const int32_t vk = p.stage[k].nodes.back(), vj = p.stage[j].nodes.front();
          const Time tk = run.node_step[size_t(slot - k) * size_t(n) + size_t(vk)];
          const Time tj = run.node_step[size_t(slot - j) * size_t(n) + size_t(vj)];
          CHECK(!brute_before(run.schedule.syncs, k, tk, j, tj));
        }
    }
  }
  // Bad input names what is wrong.
  planner::PipelineGraph g;
  g.names = {"a", "b", "c"};
  g.cost = {1, 1, 1};
  g.buffers = {{"x", 0, {1, 2}, false, 8}, {"y", 1, {2}, true, 8}};
  g.edges = {{0, 1}, {1, 2}};
  planner::PipelineOptions options;
  options.in_flight = 0;
  CHECK_THROWS(std::invalid_argument, planner::plan_pipeline(g, options));
  options.in_flight = 2;
  options.stages = 0;
  CHECK_THROWS(std::invalid_argument, planner::plan_pipeline(g, options));
  options.stages = 4;
  CHECK_THROWS(std::invalid_argument, planner::plan_pipeline(g, options));
  options.stages = 2;
  options.stage_of = {1, 0, 1};
  try {
    planner::plan_pipeline(g, options);
    report_failure(__FILE__, __LINE__, "a cut that breaks a dependency was accepted");
  } catch (const std::invalid_argument& e) {
    CHECK_MSG(contains(e.what(), "breaks a dependency") && contains(e.what(), "node b"), e.what());
  }
  options.stage_of = {0, 0, 0};
  CHECK_THROWS(std::invalid_argument, planner::plan_pipeline(g, options));  // stage 1 empty
  options.stage_of = {0, 1, 1};
  const auto p = planner::plan_pipeline(g, options);
  CHECK(p.slots.size() == 2 && p.slots[0].copies == 2 && p.slots[1].copies == 2);
  g.cost = {1, -1, 1};
  CHECK_THROWS(std::invalid_argument, planner::plan_pipeline(g, options));
  g.cost = {1, 1, 1};
  g.edges = {{2, 1}};
  CHECK_THROWS(std::invalid_argument, planner::plan_pipeline(g, options));
  // The balanced cut: equal costs in two halves, the cut where the fewest bytes cross.
  planner::PipelineGraph line;
  for (int v = 0; v < 8; ++v) {
    line.names.push_back("v" + std::to_string(v));
    line.cost.push_back(1);
  }
  for (int v = 0; v + 1 < 8; ++v) line.buffers.push_back({"o" + std::to_string(v), v, {v + 1}, false, v == 3 ? 1 : 100});
  const auto cut = planner::cut_stages(line, 2, 0.3);
  CHECK(cut == std::vector<int32_t>({0, 0, 0, 0, 1, 1, 1, 1}));
}

}  // namespace

std::vector<Test> planner_streams_tests() {
  return {
      {"planner_streams_random", test_planner_streams_random},
      {"planner_streams_bad_input", test_planner_streams_bad_input},
      {"planner_pipeline", test_planner_pipeline},
  };
}

}  // namespace core_driver
