#include "core/planner/search.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <limits>
#include <memory>
#include <numeric>
#include <tuple>

#include "core/planner/intervals.h"
#include "core/planner/lower_bound.h"
#include "core/planner/preorder.h"
#include "core/planner/range_max_tree.h"

namespace torchmem::planner {

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {

struct Instance {
  std::vector<Buffer> buffers;     // non-zero sizes only
  std::vector<int32_t> original;   // index into the caller's vector
  Sections sections;
  std::vector<int64_t> adj_start;  // CSR of time overlaps
  std::vector<int32_t> adj;
  std::vector<int64_t> mem_start;  // CSR of buffers per section
  std::vector<int32_t> mem;
};

Instance make_instance(const std::vector<Buffer>& all) {
  Instance in;
  for (int32_t i = 0; i < int32_t(all.size()); ++i) {
    if (all[i].size > 0) {
      in.buffers.push_back(all[i]);
      in.original.push_back(i);
    }
  }
  const int32_t n = int32_t(in.buffers.size());
  in.sections = make_sections(in.buffers);
  const Sections& s = in.sections;
  // Overlaps by a sweep over sections.
  std::vector<std::vector<int32_t>> starts(std::max(s.count(), 1));
  for (int32_t b = 0; b < n; ++b) starts[s.first[b]].push_back(b);
  std::vector<std::vector<int32_t>> lists(n);
  std::vector<int32_t> live;
  for (int32_t k = 0; k < s.count(); ++k) {
    live.erase(std::remove_if(live.begin(), live.end(), [&](int32_t b) { return s.last[b] <= k; }), live.end());
    for (int32_t b : starts[k]) {
      for (int32_t o : live) {
        lists[b].push_back(o);
        lists[o].push_back(b);
      }
      for (int32_t o : starts[k]) {
        if (o != b) lists[b].push_back(o);
      }
    }
    live.insert(live.end(), starts[k].begin(), starts[k].end());
  }
  in.adj_start.assign(n + 1, 0);
  for (int32_t b = 0; b < n; ++b) in.adj_start[b + 1] = in.adj_start[b] + int64_t(lists[b].size());
  in.adj.reserve(in.adj_start[n]);
  for (auto& l : lists) in.adj.insert(in.adj.end(), l.begin(), l.end());
  in.mem_start.assign(s.count() + 1, 0);
  for (int32_t b = 0; b < n; ++b) {
    for (int32_t k = s.first[b]; k < s.last[b]; ++k) ++in.mem_start[k + 1];
  }
  for (int32_t k = 0; k < s.count(); ++k) in.mem_start[k + 1] += in.mem_start[k];
  in.mem.resize(in.mem_start[s.count()]);
  std::vector<int64_t> fill(in.mem_start.begin(), in.mem_start.end() - 1);
  for (int32_t b = 0; b < n; ++b) {
    for (int32_t k = s.first[b]; k < s.last[b]; ++k) in.mem[fill[k]++] = b;
  }
  return in;
}

// Range add, range max over sections (the bytes still unplaced in each).
using MaxTree = RangeMaxTree<Offset>;

class Searcher {
 public:
  Searcher(const Instance& in, Offset capacity, std::string keys, std::vector<int32_t> rank, int64_t node_limit,
           const SearchLimits& limits)
      : in_(in), cap_(capacity), keys_(std::move(keys)), rank_(std::move(rank)), node_limit_(node_limit), limits_(limits) {
    const int32_t n = int32_t(in.buffers.size());
    const int32_t S = in.sections.count();
    off_.assign(n, -1);
    floor_.assign(n, 0);
    solution_.assign(n, 0);
    sec_floor_.assign(S, 0);
    sec_total_.assign(S, 0);
    cuts_.assign(std::max(S, 1), 0);
    witness_.assign(S, -1);
    for (int32_t b = 0; b < n; ++b) {
      for (int32_t k = in.sections.first[b]; k < in.sections.last[b]; ++k) sec_total_[k] += in.buffers[b].size;
      for (int32_t k = in.sections.first[b]; k + 1 < in.sections.last[b]; ++k) ++cuts_[k];
    }
    totals_ = std::make_unique<MaxTree>(sec_total_);
  }

  SearchStatus run() {
    const int32_t n = int32_t(in_.buffers.size());
    std::vector<int32_t> all(n);
    std::iota(all.begin(), all.end(), 0);
    std::sort(all.begin(), all.end(), [&](int32_t a, int32_t b) { return rank_[a] < rank_[b]; });
    for (int32_t k = 0; k < in_.sections.count(); ++k) {
      if (sec_total_[k] > cap_) return SearchStatus::kInfeasible;
    }
    return solve_split(all, 0, in_.sections.count(), {});
  }

  const std::vector<Offset>& solution() const { return solution_; }
  int64_t nodes() const { return nodes_; }

 private:
  // Solves the independent parts of `list` between the given cut points.
  SearchStatus solve_split(const std::vector<int32_t>& list, int32_t lo, int32_t hi, std::vector<int32_t> cuts) {
    if (cuts.empty()) {
      for (int32_t k = lo; k + 1 < hi; ++k) {
        if (cuts_[k] == 0) cuts.push_back(k + 1);
      }
    }
    if (cuts.empty()) return dfs(list, lo, hi, 0, -1);
    cuts.insert(cuts.begin(), lo);
    cuts.push_back(hi);
    const Sections& s = in_.sections;
    for (size_t c = 1; c < cuts.size(); ++c) {
      std::vector<int32_t> part;
      for (int32_t b : list) {
        if (off_[b] < 0 && s.first[b] < cuts[c] && s.last[b] > cuts[c - 1]) part.push_back(b);
      }
      if (part.empty()) continue;
      const std::vector<int32_t> saved = rerank(part);
      const SearchStatus st = dfs(part, cuts[c - 1], cuts[c], 0, -1);
      for (size_t i = 0; i < part.size(); ++i) rank_[part[i]] = saved[i];
      if (st != SearchStatus::kFound) return st;
    }
    return SearchStatus::kFound;
  }

  // Ranks a subproblem's buffers afresh by the preorder's keys, with the
  // pressure (T) taken from the bytes still unplaced; sorts `part` by rank.
  // Returns the previous ranks, in the new order of `part`.
  std::vector<int32_t> rerank(std::vector<int32_t>& part) {
    const Sections& s = in_.sections;
    auto key = [&](int32_t b, char c) -> double {
      const Buffer& x = in_.buffers[b];
      switch (c) {
        case 'T': {
          Offset t = 0;
          for (int32_t k = s.first[b]; k < s.last[b]; ++k) t = std::max(t, sec_total_[k]);
          return double(t);
        }
        case 'W': return double(s.last[b] - s.first[b]);
        case 'A': return double(x.size) * double(x.upper - x.lower);
        case 'Z': return double(x.size);
        default: return double(x.upper - x.lower);
      }
    };
    struct Keyed {
      std::array<double, 4> key;
      int32_t b;
      bool operator<(const Keyed& o) const { return key != o.key ? key < o.key : b < o.b; }
    };
    std::vector<Keyed> keyed(part.size());
    for (size_t i = 0; i < part.size(); ++i) {
      keyed[i].b = part[i];
      keyed[i].key.fill(0);
      for (size_t c = 0; c < keys_.size() && c < 4; ++c) keyed[i].key[c] = -key(part[i], keys_[c]);
    }
    std::sort(keyed.begin(), keyed.end());
    std::vector<int32_t> saved(part.size());
    for (size_t i = 0; i < keyed.size(); ++i) {
      part[i] = keyed[i].b;
      saved[i] = rank_[part[i]];
      rank_[part[i]] = int32_t(i);
    }
    return saved;
  }

  bool out_of_budget() {
    if (++nodes_ > node_limit_) return true;
    if ((nodes_ & 255) == 0) {
      if (limits_.cancel && limits_.cancel->load(std::memory_order_relaxed)) return true;
      if (limits_.deadline > 0 && seconds_now() > limits_.deadline) return true;
    }
    return false;
  }

  SearchStatus dfs(const std::vector<int32_t>& list, int32_t lo, int32_t hi, Offset last_off, int32_t last_rank) {
    if (out_of_budget()) return SearchStatus::kLimit;
    Offset min_top = std::numeric_limits<Offset>::max();
    bool any = false;
    for (int32_t b : list) {
      if (off_[b] >= 0) continue;
      any = true;
      min_top = std::min(min_top, floor_[b] + in_.buffers[b].size);
    }
    if (!any) return SearchStatus::kFound;
    std::vector<std::tuple<Offset, int32_t, int32_t>> cands;
    for (int32_t b : list) {
      if (off_[b] >= 0) continue;
      const Offset f = floor_[b];
      const int32_t r = rank_[b];
      if (f < last_off || (f == last_off && r < last_rank)) continue;  // not canonical
      if (f >= min_top) continue;                                      // dominated
      if (f + in_.buffers[b].size > cap_) continue;
      cands.emplace_back(f, r, b);
    }
    std::sort(cands.begin(), cands.end());
    for (const auto& [f, r, b] : cands) {
      const Mark mark = place(b, f);
      SearchStatus st = SearchStatus::kInfeasible;
      if (consistent(lo, hi, f, b, mark.floors)) st = descend(list, lo, hi, f, r, b);
      undo(mark, b);
      if (st != SearchStatus::kInfeasible) return st;
    }
    return SearchStatus::kInfeasible;
  }

  SearchStatus descend(const std::vector<int32_t>& list, int32_t lo, int32_t hi, Offset f, int32_t r, int32_t b) {
    const Sections& s = in_.sections;
    std::vector<int32_t> cuts;
    for (int32_t k = s.first[b]; k + 1 < s.last[b]; ++k) {
      if (--cuts_[k] == 0 && k >= lo && k + 1 < hi) cuts.push_back(k + 1);
    }
    const SearchStatus st = cuts.empty() ? dfs(list, lo, hi, f, r) : solve_split(list, lo, hi, cuts);
    for (int32_t k = s.first[b]; k + 1 < s.last[b]; ++k) ++cuts_[k];
    return st;
  }

  // Section inference. A section's floor is also at least the lowest floor
  // of its unplaced buffers: look for one low enough to pass, stop early.
  bool section_ok(int32_t k, Offset f) {
    if (sec_total_[k] == 0) return true;
    const Offset limit = cap_ - sec_total_[k];
    if (std::max(sec_floor_[k], f) > limit) return false;
    const int32_t w = witness_[k];
    if (w >= 0 && off_[w] < 0 && floor_[w] <= limit) return true;
    for (int64_t e = in_.mem_start[k]; e < in_.mem_start[k + 1]; ++e) {
      const int32_t o = in_.mem[e];
      if (off_[o] < 0 && floor_[o] <= limit) {
        witness_[k] = o;
        return true;
      }
    }
    return false;
  }

  // Incremental: the state before placing b was consistent, so only the
  // sections whose state changed need checking: b's own, those of buffers
  // whose floor rose (from `floors_from` in the log), and, for the rising
  // offset f, the section with the most bytes unplaced. The section that
  // failed last time is tried first (failures repeat among siblings).
  bool consistent(int32_t lo, int32_t hi, Offset f, int32_t b, size_t floors_from) {
    if (f + totals_->max(lo, hi) > cap_) return false;
    if (last_fail_ >= lo && last_fail_ < hi && !section_ok(last_fail_, f)) return false;
    const Sections& s = in_.sections;
    ranges_.clear();
    ranges_.emplace_back(s.first[b], s.last[b]);
    for (size_t i = floors_from; i < floor_log_.size(); ++i) {
      const int32_t o = floor_log_[i].first;
      ranges_.emplace_back(s.first[o], s.last[o]);
    }
    std::sort(ranges_.begin(), ranges_.end());
    int32_t done = lo;
    for (const auto& [l, r] : ranges_) {
      for (int32_t k = std::max(l, done); k < r; ++k) {
        if (!section_ok(k, f)) {
          last_fail_ = k;
          return false;
        }
      }
      done = std::max(done, r);
    }
    return true;
  }

  struct Mark {
    size_t floors, sec_floors;
  };

  Mark place(int32_t b, Offset f) {
    const Mark mark{floor_log_.size(), sec_log_.size()};
    const Sections& s = in_.sections;
    const Offset top = f + in_.buffers[b].size;
    off_[b] = f;
    solution_[b] = f;
    for (int32_t k = s.first[b]; k < s.last[b]; ++k) {
      sec_log_.emplace_back(k, sec_floor_[k]);
      sec_floor_[k] = std::max(sec_floor_[k], top);
      sec_total_[k] -= in_.buffers[b].size;
    }
    totals_->add(s.first[b], s.last[b], -in_.buffers[b].size);
    for (int64_t e = in_.adj_start[b]; e < in_.adj_start[b + 1]; ++e) {
      const int32_t o = in_.adj[e];
      if (off_[o] >= 0 || floor_[o] >= top) continue;
      floor_log_.emplace_back(o, floor_[o]);
      floor_[o] = top;
    }
    return mark;
  }

  void undo(const Mark& mark, int32_t b) {
    while (sec_log_.size() > mark.sec_floors) {
      sec_floor_[sec_log_.back().first] = sec_log_.back().second;
      sec_log_.pop_back();
    }
    while (floor_log_.size() > mark.floors) {
      floor_[floor_log_.back().first] = floor_log_.back().second;
      floor_log_.pop_back();
    }
    const Sections& s = in_.sections;
    for (int32_t k = s.first[b]; k < s.last[b]; ++k) sec_total_[k] += in_.buffers[b].size;
    totals_->add(s.first[b], s.last[b], in_.buffers[b].size);
    off_[b] = -1;
  }

  const Instance& in_;
  const Offset cap_;
  const std::string keys_;
  std::vector<int32_t> rank_;
  const int64_t node_limit_;
  const SearchLimits& limits_;
  int64_t nodes_ = 0;
  std::vector<Offset> off_, floor_, solution_, sec_floor_, sec_total_;
  std::vector<int32_t> cuts_;
  std::vector<int32_t> witness_;  // per section: the last buffer that passed it (a hint)
  int32_t last_fail_ = -1;        // the section that failed the last check (a hint)
  std::unique_ptr<MaxTree> totals_;  // mirrors sec_total_
  std::vector<std::pair<int32_t, int32_t>> ranges_;
  std::vector<std::pair<int32_t, Offset>> floor_log_, sec_log_;
};

bool out_of_time(const SearchLimits& limits) {
  if (limits.cancel && limits.cancel->load(std::memory_order_relaxed)) return true;
  return limits.deadline > 0 && seconds_now() > limits.deadline;
}

// Round robin over preorders, each attempt under a node limit that doubles
// after every full turn; resumable so repeated calls on one target continue.
struct RoundRobin {
  int64_t attempt_limit = 0;
  size_t next = 0;
};

SearchResult search_instance(const Instance& in, size_t n_all, Offset capacity,
                             const std::vector<std::vector<int32_t>>& ranks, const std::vector<std::string>& keys,
                             const SearchLimits& limits, RoundRobin* state = nullptr) {
  SearchResult result;
  RoundRobin local;
  RoundRobin& rr = state ? *state : local;
  if (rr.attempt_limit == 0) rr.attempt_limit = 2 * std::max<int64_t>(int64_t(in.buffers.size()), 16);
  const int64_t total_limit = limits.node_limit < 0 ? std::numeric_limits<int64_t>::max() : limits.node_limit;
  while (true) {
    for (; rr.next < ranks.size(); ++rr.next) {
      const int64_t budget = std::min(rr.attempt_limit, total_limit - result.nodes);
      if (budget <= 0 || out_of_time(limits)) {
        result.status = SearchStatus::kLimit;
        return result;
      }
      Searcher searcher(in, capacity, keys[rr.next], ranks[rr.next], budget, limits);
      const SearchStatus st = searcher.run();
      result.nodes += std::min(searcher.nodes(), budget);
      if (st == SearchStatus::kLimit) {
        if (budget < rr.attempt_limit) {  // cut short by the total: retry this one next call
          result.status = SearchStatus::kLimit;
          return result;
        }
        continue;
      }
      result.status = st;
      if (st == SearchStatus::kFound) {
        result.offsets.assign(n_all, 0);
        for (size_t i = 0; i < in.original.size(); ++i) result.offsets[in.original[i]] = searcher.solution()[i];
      }
      return result;
    }
    rr.next = 0;
    rr.attempt_limit *= 2;
  }
}

std::vector<std::vector<int32_t>> make_ranks(const Instance& in, const std::vector<std::string>& preorders) {
  std::vector<std::vector<int32_t>> ranks;
  for (const std::string& p : preorders) ranks.push_back(ranks_of(preorder(in.buffers, in.sections, p)));
  return ranks;
}

const std::vector<std::string> kDefaultPreorders = {"LAT", "TAL", "TLA", "WAT", "TAW", "TWA"};

}  // namespace

SearchResult search_capacity(const std::vector<Buffer>& buffers, Offset capacity,
                             const std::vector<std::string>& preorders, const SearchLimits& limits) {
  const Instance in = make_instance(buffers);
  const auto& keys = preorders.empty() ? kDefaultPreorders : preorders;
  return search_instance(in, buffers.size(), capacity, make_ranks(in, keys), keys, limits);
}

MinimizeResult search_minimize(const std::vector<Buffer>& buffers, std::vector<Offset> incumbent,
                               Offset lb, const SearchLimits& limits,
                               const std::function<void(Offset)>& on_improve,
                               const std::vector<std::string>& preorders) {
  MinimizeResult result;
  result.offsets = std::move(incumbent);
  result.height = height_of(buffers, result.offsets);
  if (result.height <= lb) {
    result.optimal = true;
    return result;
  }
  const Instance in = make_instance(buffers);
  const bool large = in.buffers.size() > kLargeInstance;
  static const std::vector<std::string> kLargePreorders = {"AZ"};
  const std::vector<std::string>& keys = !preorders.empty() ? preorders : large ? kLargePreorders : kDefaultPreorders;
  const auto ranks = make_ranks(in, keys);
  const Offset g = size_granularity(buffers);
  // Heights are multiples of g. Each round tries the proven bound, descends
  // from the incumbent by steps that double after a success and halve after
  // running out of nodes, then tries the bound again with 4x the nodes (real
  // and crafted instances are often feasible there; attempts at the bound
  // resume where the last one stopped). Rounds double the node budget.
  Offset proven = (lb + g - 1) / g * g;
  int64_t budget = large ? int64_t(in.buffers.size()) * 2 : std::max<int64_t>(int64_t(in.buffers.size()) * 64, 4096);
  RoundRobin at_bound;
  const int64_t total = limits.node_limit < 0 ? std::numeric_limits<int64_t>::max() : limits.node_limit;
  auto spent = [&] { return out_of_time(limits) || result.nodes >= total; };
  auto decide = [&](Offset target, int64_t nodes) {
    SearchLimits sub = limits;
    sub.node_limit = std::min(nodes, total - result.nodes);
    const SearchResult r = search_instance(in, buffers.size(), target, ranks, keys, sub,
                                           target == (lb + g - 1) / g * g ? &at_bound : nullptr);
    result.nodes += r.nodes;
    if (r.status == SearchStatus::kFound) {
      result.offsets = r.offsets;
      result.height = height_of(buffers, r.offsets);
      if (on_improve) on_improve(result.height);
    } else if (r.status == SearchStatus::kInfeasible) {
      proven = std::max(proven, target + g);
    }
    return r.status;
  };
  while (!spent() && proven < result.height) {
    if (!large) decide(proven, budget);
    Offset step = large ? std::max(g, (result.height - proven) / 2 / g * g) : g;
    while (proven < result.height && !spent()) {
      const Offset target = std::max(proven, result.height - step);
      const SearchStatus st = decide(target, budget);
      if (st == SearchStatus::kFound) {
        if (!large) step *= 2;
      } else if (st == SearchStatus::kInfeasible) {
        step = std::max(g, (result.height - proven) / 2 / g * g);
      } else if (step == g) {
        break;
      } else {
        step = std::max(g, step / 2 / g * g);
      }
    }
    if (!large && !spent() && proven < result.height) decide(proven, 4 * budget);
    budget *= 2;
  }
  result.optimal = proven >= result.height;
  return result;
}

}  // namespace torchmem::planner
