/* What device memory reads back as: the fake GPU keeps no device data.
 *
 * Note [Device memory holds no data]
 * Kernels are skipped, so the values on the fake device are garbage anyway.
 * Copies and memsets therefore never write device memory: its pages stay
 * untouched and cost the host nothing (address_space.c, driver.c). A read
 * from the device (device-to-host) writes zeros to the host side, except for
 * the bytes of small copies kept here:
 *   - a host-to-device or device-to-device copy, or a memset, of at most
 *     FG_KEPT_COPY bytes keeps its bytes, while the total kept stays within
 *     FG_KEPT_TOTAL; a larger one leaves its destination reading zeros;
 *   - the next kernel launch (or graph launch) drops every kept byte, since
 *     on a real card a kernel may have written anywhere; so does freeing or
 *     unmapping the memory.
 * So metadata a script copies up and reads back with no kernel between (DDP's
 * check of parameter shapes, object collectives) round-trips, while a value
 * a kernel computed (GradScaler's found_inf, an overflow flag, a count for
 * nonzero()) reads zero. docs/preflight.md gives the rule and its limits.
 * With TORCHMEM_FAKEGPU_DATA=1 the device keeps its data as host memory does:
 * every copy is memmove and every memset writes. torchmem's own tests of its
 * CUDA allocator use that to check that blocks keep their bytes; preflight
 * never sets it.
 * Memory outside the device address space (pinned, registered or pageable
 * host memory, registered variables' host shadows) is real: copies between
 * such addresses are memmove, and a memset there writes.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "state.h"

struct piece {
  uintptr_t start;
  size_t size;
  unsigned char *bytes;
};

/* Sorted by start, never overlapping; guarded by fg_lock. */
static struct piece *pieces = NULL;
static size_t piece_count = 0, piece_capacity = 0;
static size_t kept_total = 0;
static long long seen_launches = 0;

static void clear_locked(void) {
  for (size_t i = 0; i < piece_count; ++i) free(pieces[i].bytes);
  piece_count = 0;
  kept_total = 0;
}

/* Drops everything kept when a kernel has run since the last look. */
static void check_launches_locked(void) {
  long long now = fg_counters[FG_KERNEL_LAUNCHES] + fg_counters[FG_GRAPH_LAUNCHES];
  if (now != seen_launches) {
    clear_locked();
    seen_launches = now;
  }
}

/* Inserts a piece holding a copy of `bytes` at position `at`; -1 when out of memory. */
static int insert_at_locked(size_t at, uintptr_t start, const unsigned char *bytes, size_t size) {
  if (piece_count == piece_capacity) {
    size_t grown_capacity = piece_capacity ? 2 * piece_capacity : 64;
    struct piece *grown = realloc(pieces, grown_capacity * sizeof *pieces);
    if (grown == NULL) return -1;
    pieces = grown;
    piece_capacity = grown_capacity;
  }
  unsigned char *copy = malloc(size);
  if (copy == NULL) return -1;
  memcpy(copy, bytes, size);
  memmove(&pieces[at + 1], &pieces[at], (piece_count - at) * sizeof *pieces);
  pieces[at] = (struct piece){start, size, copy};
  ++piece_count;
  kept_total += size;
  return 0;
}

/* Forgets the kept bytes of [start, end): what lies there reads zero. */
static void erase_locked(uintptr_t start, uintptr_t end) {
  size_t i = 0;
  while (i < piece_count) {
    struct piece p = pieces[i];
    uintptr_t p_end = p.start + p.size;
    if (p_end <= start || p.start >= end) {
      ++i;
      continue;
    }
    memmove(&pieces[i], &pieces[i + 1], (piece_count - i - 1) * sizeof *pieces);
    --piece_count;
    kept_total -= p.size;
    /* Keep the parts outside the range (a failed insert just forgets them). */
    if (p.start < start && insert_at_locked(i, p.start, p.bytes, start - p.start) == 0) ++i;
    if (p_end > end && insert_at_locked(i, end, p.bytes + (end - p.start), p_end - end) == 0) ++i;
    free(p.bytes);
  }
}

/* Keeps `size` bytes at `start` (after forgetting what was there), within the budget. */
static void keep_locked(uintptr_t start, const unsigned char *bytes, size_t size) {
  erase_locked(start, start + size);
  if (size == 0 || size > FG_KEPT_COPY || kept_total + size > FG_KEPT_TOTAL) return;
  size_t at = 0;
  while (at < piece_count && pieces[at].start < start) ++at;
  insert_at_locked(at, start, bytes, size);
}

/* Writes the kept bytes of the device range [src, src + size) over host memory `dst`. */
static void overlay_locked(unsigned char *dst, uintptr_t src, size_t size) {
  for (size_t i = 0; i < piece_count; ++i) {
    const struct piece *p = &pieces[i];
    uintptr_t from = p->start > src ? p->start : src;
    uintptr_t to = p->start + p->size < src + size ? p->start + p->size : src + size;
    if (from < to) memcpy(dst + (from - src), p->bytes + (from - p->start), to - from);
  }
}

void fg_contents_reset_locked(void) {
  clear_locked();
  seen_launches = 0;
}

void fg_contents_forget(const void *ptr, size_t size) {
  pthread_mutex_lock(&fg_lock);
  erase_locked((uintptr_t)ptr, (uintptr_t)ptr + size);
  pthread_mutex_unlock(&fg_lock);
}

void fg_unmap_device_range(void *ptr, size_t size) {
  fg_contents_forget(ptr, (size + FG_GRANULE - 1) & ~(FG_GRANULE - 1)); /* the granules fg_unmap_aligned drops */
  fg_unmap_aligned(ptr, size);
}

void fg_contents_copy(void *dst, const void *src, size_t size) {
  if (size == 0 || dst == src) return;
  int to_device = fg_in_device_space(dst), from_device = fg_in_device_space(src);
  if (fg_keep_data || (!to_device && !from_device)) {
    memmove(dst, src, size);
    return;
  }
  if (!to_device) memset(dst, 0, size); /* a read from the device: zeros, then what is kept */
  pthread_mutex_lock(&fg_lock);
  check_launches_locked();
  if (!to_device) overlay_locked(dst, (uintptr_t)src, size);
  else if (!from_device) keep_locked((uintptr_t)dst, src, size);
  else if (size > FG_KEPT_COPY) erase_locked((uintptr_t)dst, (uintptr_t)dst + size);
  else {
    unsigned char *staged = calloc(1, size);
    if (staged != NULL) overlay_locked(staged, (uintptr_t)src, size);
    if (staged != NULL) keep_locked((uintptr_t)dst, staged, size);
    else erase_locked((uintptr_t)dst, (uintptr_t)dst + size);
    free(staged);
  }
  pthread_mutex_unlock(&fg_lock);
}

void fg_contents_fill(void *dst, int value, size_t size) {
  if (size == 0) return;
  if (fg_keep_data || !fg_in_device_space(dst)) {
    memset(dst, value, size);
    return;
  }
  unsigned char *staged = (unsigned char)value != 0 && size <= FG_KEPT_COPY ? malloc(size) : NULL;
  if (staged != NULL) memset(staged, value, size);
  pthread_mutex_lock(&fg_lock);
  check_launches_locked();
  if (staged != NULL) keep_locked((uintptr_t)dst, staged, size);
  else erase_locked((uintptr_t)dst, (uintptr_t)dst + size);
  pthread_mutex_unlock(&fg_lock);
  free(staged);
}

/* For the other stand-ins (NCCL's collectives): a copy under the rule above. */
void fakegpu_copy(void *dst, const void *src, size_t size) {
  fg_init();
  fg_contents_copy(dst, src, size);
}

long long fakegpu_kept_bytes(void) {
  fg_init();
  pthread_mutex_lock(&fg_lock);
  check_launches_locked();
  long long kept = (long long)kept_total;
  pthread_mutex_unlock(&fg_lock);
  return kept;
}
