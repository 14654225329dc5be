#include "core/planner/portfolio.h"

#include <functional>
#include <utility>

#include "core/planner/bottom_up.h"
#include "core/planner/greedy.h"
#include "core/planner/intervals.h"
#include "core/planner/preorder.h"
#include "core/planner/search.h"
#include "core/planner/sweep_line.h"

namespace torchmem::planner {

PortfolioResult place_portfolio(const std::vector<Buffer>& buffers, Offset lb, double deadline) {
  const Sections sections = make_sections(buffers);
  std::vector<std::pair<std::string, std::function<std::vector<Offset>()>>> members;
  // The best members on real traces first: on large inputs the deadline may
  // stop the portfolio after a few.
  for (const char* keys : {"AZ", "TLZ", "QZ"}) {
    members.emplace_back(std::string("bottom_up:") + keys,
                         [&, keys] { return place_bottom_up(buffers, sections, preorder(buffers, sections, keys)); });
  }
  members.emplace_back("greedy", [&] { return place_greedy(buffers); });
  for (const char* keys : {"TAL", "TLA", "LAT", "ZLA", "WAT", "TWA"}) {
    members.emplace_back(std::string("bottom_up:") + keys,
                         [&, keys] { return place_bottom_up(buffers, sections, preorder(buffers, sections, keys)); });
  }
  members.emplace_back("best_fit:pressure",
                       [&] { return place_best_fit(buffers, make_order(buffers, Order::kConflictDesc)); });
  members.emplace_back("sweep", [&] { return place_sweep_line(buffers); });
  PortfolioResult best;
  bool have = false;
  for (auto& [name, run] : members) {
    if (have && (best.height <= lb || (deadline > 0 && seconds_now() > deadline))) break;
    std::vector<Offset> offsets = run();
    const Offset h = height_of(buffers, offsets);
    if (!have || h < best.height) {
      best.offsets = std::move(offsets);
      best.height = h;
      best.member = name;
      have = true;
    }
  }
  return best;
}

}  // namespace torchmem::planner
