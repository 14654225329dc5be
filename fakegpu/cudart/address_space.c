/* The device address space: one reserved range of host address space out of
 * which cudaMalloc and cuMemAddressReserve take 2 MiB-aligned ranges. Addresses
 * therefore do not depend on the host's mmap layout. A range is mapped
 * read-write (or left PROT_NONE for a reservation) when taken and dropped back
 * to PROT_NONE, with its backing released, when returned.
 *
 * Note [Falling device addresses]
 * PyTorch's best fit breaks a tie between free blocks of one size by address,
 * so the order of segment addresses decides where a block lands. Snapshots
 * recorded on GPUs whose device pointers sit high in the process (0x7e..,
 * 0x7f..) show segments placed top-down: each new segment below the last, and
 * after empty_cache() the highest released range that fits is taken again,
 * filled from its top. With TORCHMEM_FAKEGPU_ADDRESSES=falling cudaMalloc
 * does the same: the top of the highest free range that fits. The default,
 * rising, takes the bottom of the lowest free range that fits, as recordings
 * with low pointers (0x5..) show. Rising stays the default while torchmem's
 * replay of a run recorded mid-way dates its start segments by address
 * (oldest lowest): on torch 2.13+, which breaks ties by segment age, that
 * replay is exact only for rising addresses.
 * Reservations (cuMemAddressReserve, expandable segments) always take the
 * lowest free range: no recording here shows where a driver puts them.
 * Nothing in the fake writes this space (Note [Device memory holds no data],
 * contents.c), so its pages are never backed. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "state.h"

#define SPACE_SIZE (8ULL << 40) /* 8 TiB of address space, reserved, never backed */

struct hole {
  uintptr_t start, end;
};

static pthread_mutex_t space_lock = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t space_start = 0;
static struct hole *holes = NULL;
static size_t hole_count = 0, hole_capacity = 0;

static int reserve_space_locked(void) {
  if (space_start != 0) return 0;
  void *p = mmap(NULL, SPACE_SIZE + FG_GRANULE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return -1;
  space_start = ((uintptr_t)p + FG_GRANULE - 1) & ~(uintptr_t)(FG_GRANULE - 1);
  holes = malloc(64 * sizeof *holes);
  if (holes == NULL) return -1;
  hole_capacity = 64;
  holes[0] = (struct hole){space_start, space_start + SPACE_SIZE};
  hole_count = 1;
  return 0;
}

static int insert_hole_locked(size_t at, struct hole h) {
  if (hole_count == hole_capacity) {
    struct hole *grown = realloc(holes, 2 * hole_capacity * sizeof *holes);
    if (grown == NULL) return -1;
    holes = grown;
    hole_capacity *= 2;
  }
  memmove(&holes[at + 1], &holes[at], (hole_count - at) * sizeof *holes);
  holes[at] = h;
  ++hole_count;
  return 0;
}

static int falling_addresses(void) {
  static int value = -1;
  if (value < 0) {
    const char *v = getenv("TORCHMEM_FAKEGPU_ADDRESSES");
    value = v != NULL && strcmp(v, "falling") == 0;
  }
  return value;
}

/* Takes size bytes from the free ranges: the bottom of the lowest that fits, or
 * with from_top the top of the highest that fits. 0 when none fits. */
static uintptr_t take_locked(size_t size, int from_top) {
  for (size_t k = 0; k < hole_count; ++k) {
    size_t i = from_top ? hole_count - 1 - k : k;
    if (holes[i].end - holes[i].start < size) continue;
    uintptr_t start;
    if (from_top) {
      holes[i].end -= size;
      start = holes[i].end;
    } else {
      start = holes[i].start;
      holes[i].start += size;
    }
    if (holes[i].start == holes[i].end) {
      memmove(&holes[i], &holes[i + 1], (hole_count - i - 1) * sizeof *holes);
      --hole_count;
    }
    return start;
  }
  return 0;
}

static void *map_range(size_t size, int prot, int from_top) {
  size = (size + FG_GRANULE - 1) & ~(FG_GRANULE - 1);
  void *result = NULL;
  pthread_mutex_lock(&space_lock);
  if (reserve_space_locked() == 0) result = (void *)take_locked(size, from_top);
  pthread_mutex_unlock(&space_lock);
  if (result != NULL && prot != PROT_NONE && mprotect(result, size, prot) != 0) {
    fg_unmap_aligned(result, size);
    return NULL;
  }
  return result;
}

void *fg_map_aligned(size_t size, int prot) { return map_range(size, prot, 0); }

void *fg_map_device(size_t size, int prot) { return map_range(size, prot, falling_addresses()); }

int fg_in_device_space(const void *ptr) {
  uintptr_t p = (uintptr_t)ptr;
  pthread_mutex_lock(&space_lock);
  int inside = space_start != 0 && p >= space_start && p < space_start + SPACE_SIZE;
  pthread_mutex_unlock(&space_lock);
  return inside;
}

void fg_unmap_aligned(void *ptr, size_t size) {
  size = (size + FG_GRANULE - 1) & ~(FG_GRANULE - 1);
  /* Drop the backing and the access; the range stays reserved. */
  mmap(ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  struct hole h = {(uintptr_t)ptr, (uintptr_t)ptr + size};
  pthread_mutex_lock(&space_lock);
  size_t at = 0;
  while (at < hole_count && holes[at].start < h.start) ++at;
  int merged = 0;
  if (at > 0 && holes[at - 1].end == h.start) {
    holes[at - 1].end = h.end;
    merged = 1;
    if (at < hole_count && holes[at].start == h.end) {
      holes[at - 1].end = holes[at].end;
      memmove(&holes[at], &holes[at + 1], (hole_count - at - 1) * sizeof *holes);
      --hole_count;
    }
  } else if (at < hole_count && holes[at].start == h.end) {
    holes[at].start = h.start;
    merged = 1;
  }
  if (!merged) insert_hole_locked(at, h);
  pthread_mutex_unlock(&space_lock);
}
