// LiveBlockMap against std::unordered_map: random inserts, lookups and
// removals over clustered addresses (neighbouring 64-byte blocks, so probe
// runs are long and backward-shift deletion is exercised), through growth.
// Exit status 0 when every check holds; prints the first failure otherwise.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <unordered_map>
#include <vector>

#include "core/base/live_block_map.h"

using torchmem::Block;
using torchmem::LiveBlockMap;

namespace {

int failures = 0;

void check(bool ok, const char* what, unsigned long step) {
  if (!ok && failures++ == 0) std::fprintf(stderr, "FAILED at step %lu: %s\n", step, what);
}

Block* fake_block(uintptr_t addr) { return reinterpret_cast<Block*>(addr ^ 0x5a5a5a5a5a5a5a00ull); }

void run(uint64_t seed, size_t steps, size_t universe, uintptr_t stride) {
  std::mt19937_64 rng(seed);
  LiveBlockMap map;
  std::unordered_map<uintptr_t, Block*> model;
  for (size_t step = 0; step < steps && failures == 0; ++step) {
    const uintptr_t addr = 0x7f0000000000ull + (rng() % universe) * stride;
    const int op = static_cast<int>(rng() % 3);
    if (op == 0 && !model.count(addr)) {
      map.insert(addr, fake_block(addr));
      model[addr] = fake_block(addr);
    } else if (op == 1) {
      Block* got = map.take(addr);
      auto it = model.find(addr);
      check(got == (it == model.end() ? nullptr : it->second), "take returns the block, or null", step);
      if (it != model.end()) model.erase(it);
    } else {
      auto it = model.find(addr);
      check(map.find(addr) == (it == model.end() ? nullptr : it->second), "find agrees with the model", step);
    }
    check(map.size() == model.size(), "size agrees", step);
    check(map.empty() == model.empty(), "empty agrees", step);
    if (step % 997 == 0) {
      size_t seen = 0;
      map.for_each([&](Block* b) {
        ++seen;
        const uintptr_t a = reinterpret_cast<uintptr_t>(b) ^ 0x5a5a5a5a5a5a5a00ull;
        check(model.count(a) == 1 && model[a] == b, "for_each visits only live entries", step);
      });
      check(seen == model.size(), "for_each visits every entry once", step);
      for (const auto& kv : model) check(map.find(kv.first) == kv.second, "every model entry is found", step);
    }
  }
}

}  // namespace

int main() {
  run(1, 200000, 64, 64);          // few keys: the table stays small, long probe runs
  run(2, 200000, 5000, 64);        // growth past the initial capacity, adjacent blocks
  run(3, 200000, 3000, 512 << 10); // sparse addresses, strides of a power of two
  run(4, 100000, 100000, 2 << 20); // mostly inserts: several growths
  if (failures) {
    std::fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  std::printf("live_block_map: ok\n");
  return 0;
}
