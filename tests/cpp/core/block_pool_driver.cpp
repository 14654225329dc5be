// Core driver: block pool (tests/cpp/core_driver.cpp runs it).
#include "core_checks.h"

namespace core_driver {

namespace {

// Paged block pool: random operations against a reference count model.

struct PoolModel {
  std::vector<int32_t> ref;
  explicit PoolModel(int n) : ref(n, 0) {}
};

void check_pool_matches(const PagedBlockPool& pool, const PoolModel& model) {
  int used = 0;
  bool ok = true;
  for (int32_t i = 0; i < pool.num_blocks(); ++i) {
    ok &= pool.ref_count(i) == model.ref[i];
    used += model.ref[i] > 0;
  }
  CHECK_MSG(ok, "reference counts differ from the model");
  CHECK(pool.num_used() == used);
  INVARIANTS(pool);
}

void test_block_pool_random() {
  for (int round = 0; round < scaled(20, 4); ++round) {
    const int n = 4 + round % 13;
    PagedBlockPool pool(n);
    PoolModel model(n);
    std::mt19937_64 rng(g_seed * 101 + round);
    uint64_t next_hash = 1;
    auto used_ids = [&] {
      std::vector<BlockId> out;
      for (int i = 0; i < n; ++i)
        if (model.ref[i] > 0) out.push_back(i);
      return out;
    };
    for (int step = 0; step < scaled(3000, 500); ++step) {
      const unsigned op = rng() % 12;
      std::vector<BlockId> used = used_ids();
      if (op == 0) {
        const BlockId b = pool.try_allocate();
        if (b == kNoBlock) {
          CHECK(pool.num_free() == 0);
        } else {
          CHECK(model.ref[b] == 0);
          model.ref[b] = 1;
        }
      } else if (op == 1) {
        const size_t k = rng() % 4;
        std::vector<BlockId> out(k + 1, kNoBlock);
        if (pool.try_allocate_n(k, out.data())) {
          for (size_t i = 0; i < k; ++i) {
            CHECK(model.ref[out[i]] == 0);
            model.ref[out[i]] = 1;
          }
        } else {
          CHECK(static_cast<size_t>(pool.num_free()) < k);
        }
      } else if ((op == 2 || op == 3) && !used.empty()) {
        const BlockId b = used[rng() % used.size()];
        pool.release(b);
        --model.ref[b];
      } else if (op == 4 && !used.empty()) {
        const BlockId b = used[rng() % used.size()];
        pool.retain(b);
        ++model.ref[b];
      } else if (op == 5 && !used.empty()) {
        std::vector<BlockId> batch;
        for (BlockId b : used)
          if (rng() % 2) batch.push_back(b);
        pool.release_n(batch.data(), batch.size());
        for (BlockId b : batch) --model.ref[b];
      } else if (op == 6 && !used.empty()) {
        const BlockId b = used[rng() % used.size()];
        const bool throwing = rng() % 4 == 0;
        const int before = model.ref[b];
        try {
          const BlockId w = pool.make_writable(b, [&](BlockId, BlockId) {
            if (throwing) throw std::runtime_error("copy failed");
          });
          if (w != b) {
            CHECK(before > 1 && model.ref[w] == 0);
            --model.ref[b];
            model.ref[w] = 1;
          } else {
            CHECK(before == 1);
          }
        } catch (const OutOfBlocks&) {
          CHECK(before > 1 && pool.num_free() == 0);  // no block for the copy; the pool is unchanged
        } catch (const std::runtime_error&) {
          CHECK(throwing);  // the pool is unchanged: checked below
        }
      } else if (op == 7 && !used.empty()) {
        const BlockId b = used[rng() % used.size()];
        if (pool.has_hash(b)) {
          CHECK_THROWS(std::invalid_argument, pool.set_hash(b, 1000 + next_hash++));
        } else {
          const uint64_t h = next_hash++ % 7;
          const BlockId holder = pool.lookup(h);
          CHECK(pool.set_hash(b, h) == (holder == kNoBlock));
        }
      } else if (op == 8) {
        const BlockId b = pool.acquire_cached(rng() % 7);
        if (b != kNoBlock) ++model.ref[b];
      } else if (op == 9) {
        // Misuse: out of range, not in use, a batch that over-releases.
        const int32_t before_free = pool.num_free();
        CHECK_THROWS(std::invalid_argument, pool.release(n));
        CHECK_THROWS(std::invalid_argument, pool.release(-1));
        CHECK_THROWS(std::invalid_argument, pool.retain(n + 5));
        for (int i = 0; i < n; ++i)
          if (model.ref[i] == 0) {
            CHECK_THROWS(std::invalid_argument, pool.release(i));
            CHECK_THROWS(std::invalid_argument, pool.retain(i));
            break;
          }
        if (!used.empty()) {
          const BlockId b = used[0];
          std::vector<BlockId> twice(model.ref[b] + 1, b);
          CHECK_THROWS(std::invalid_argument, pool.release_n(twice.data(), twice.size()));
        }
        CHECK(pool.num_free() == before_free);
      } else if (op == 10) {
        const size_t k = pool.num_free() + 1;
        std::vector<BlockId> out(k);
        CHECK_THROWS(OutOfBlocks, pool.allocate_n(k, out.data()));
      } else if (op == 11 && !used.empty()) {
        std::vector<BlockId> last;
        for (BlockId b : used)
          if (rng() % 3 == 0) last.push_back(b);
        const size_t n_new = rng() % 3;
        std::vector<BlockId> fresh(n_new + 1);
        std::vector<PagedBlockPool::Copy> copies;
        std::vector<BlockId> orig = last;
        try {
          pool.allocate_and_make_writable(n_new, fresh.data(), last.data(), last.size(), &copies);
          for (size_t i = 0; i < n_new; ++i) model.ref[fresh[i]] = 1;
          for (size_t i = 0; i < last.size(); ++i)
            if (last[i] != orig[i]) {
              --model.ref[orig[i]];
              model.ref[last[i]] = 1;
            }
        } catch (const OutOfBlocks&) {
          CHECK(last == orig);
        } catch (const std::invalid_argument&) {
          CHECK(last == orig);  // duplicates in `last`: all or nothing
        }
      }
      check_pool_matches(pool, model);
    }
  }
  CHECK_THROWS(std::invalid_argument, PagedBlockPool(0));
  CHECK_THROWS(std::invalid_argument, PagedBlockPool(-3));
}

}  // namespace

std::vector<Test> block_pool_tests() {
  return {
      {"block_pool_random", test_block_pool_random},
  };
}

}  // namespace core_driver
