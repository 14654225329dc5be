/* Which image of a fat binary a real driver would run for each kernel (images.h, state.h).
 *
 * Note [Kernel images and the card's compute capability]
 * A fat binary carries machine code (SASS) for some architectures and PTX for some. A real driver runs
 * the SASS of the highest architecture with the card's major and a minor at most the card's; without
 * one, it compiles the highest PTX at most the card's capability. cudaFuncGetAttributes reports that
 * image's version. PyTorch's wheels carry no sm_89 SASS for most kernels, so an RTX 4090 (8.9) runs
 * their sm_86 code and reports 86. CUB reads that version to pick its tuning policy among the
 * architectures it was compiled for; reporting 89 there made its radix sort (torch.sort above 4,096
 * elements, an embedding's backward) fail with cudaErrorInvalidDeviceFunction.
 *
 * The fat binary's layout: a header (magic 0xBA55ED50, u16 version, u16 header size, u64 size), then
 * entries, each (u16 kind: 1 PTX, 2 SASS; u16; u32 header size; u64 payload size; ...; u32 arch at
 * offset 28). Registration parses it once per binary; a hash table maps each kernel's host stub to
 * its binary's architectures. A binary that cannot be read leaves its kernels at the card's own
 * capability, as before. */
#include "images.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FATBIN_WRAPPER_MAGIC 0x466243b1u
#define FATBIN_MAGIC 0xBA55ED50u
#define KIND_PTX 1
#define KIND_SASS 2

struct fatbin_wrapper {
  int magic;
  int version;
  const unsigned char *data;
  void *filename_or_fatbins;
};

/* One registered binary: the handle the caller keeps (first, so the struct is a void **), and the
 * architectures its images are for, as bit sets over arch numbers 0..255 (86 for sm_86). */
struct fg_image_set {
  void *handle_slot;
  uint64_t sass[4], ptx[4];
};

static pthread_mutex_t images_lock = PTHREAD_MUTEX_INITIALIZER;
static const void **table_keys;
static struct fg_image_set **table_sets;
static size_t table_size, table_used;

static void add_arch(uint64_t *bits, uint32_t arch) {
  if (arch < 256) bits[arch / 64] |= 1ull << (arch % 64);
}

static int has_arch(const uint64_t *bits, int arch) { return arch >= 0 && arch < 256 && (bits[arch / 64] >> (arch % 64)) & 1; }

static void parse(struct fg_image_set *set, const void *fatbin) {
  const struct fatbin_wrapper *wrapper = fatbin;
  if (wrapper == NULL || (uint32_t)wrapper->magic != FATBIN_WRAPPER_MAGIC || wrapper->data == NULL) return;
  const unsigned char *head = wrapper->data;
  uint32_t magic;
  uint16_t header_size;
  uint64_t size;
  memcpy(&magic, head, 4);
  memcpy(&header_size, head + 6, 2);
  memcpy(&size, head + 8, 8);
  if (magic != FATBIN_MAGIC) return;
  const unsigned char *entry = head + header_size, *end = head + header_size + size;
  while (entry + 32 <= end) {
    uint16_t kind;
    uint32_t entry_header, arch;
    uint64_t payload;
    memcpy(&kind, entry, 2);
    memcpy(&entry_header, entry + 4, 4);
    memcpy(&payload, entry + 8, 8);
    memcpy(&arch, entry + 28, 4);
    if (kind == KIND_SASS) add_arch(set->sass, arch);
    if (kind == KIND_PTX) add_arch(set->ptx, arch);
    if (entry_header == 0) break;
    entry += entry_header + payload;
  }
}

static size_t slot_of(const void *key, size_t size) {
  uintptr_t h = (uintptr_t)key;
  h ^= h >> 17;
  h *= 0x9E3779B97F4A7C15ull;
  return (size_t)(h ^ (h >> 29)) & (size - 1);
}

static void grow(void) {
  size_t size = table_size ? table_size * 2 : 1 << 15;
  const void **keys = calloc(size, sizeof *keys);
  struct fg_image_set **sets = calloc(size, sizeof *sets);
  if (keys == NULL || sets == NULL) {
    free(keys);
    free(sets);
    return;
  }
  for (size_t i = 0; i < table_size; i++) {
    if (table_keys[i] == NULL) continue;
    size_t j = slot_of(table_keys[i], size);
    while (keys[j] != NULL) j = (j + 1) & (size - 1);
    keys[j] = table_keys[i];
    sets[j] = table_sets[i];
  }
  free(table_keys);
  free(table_sets);
  table_keys = keys, table_sets = sets, table_size = size;
}

void **fg_images_register(void *fatbin) {
  struct fg_image_set *set = calloc(1, sizeof *set);
  if (set == NULL) return NULL;
  parse(set, fatbin);
  return &set->handle_slot;
}

void fg_images_add_kernel(void **handle, const void *host_fun) {
  if (handle == NULL || host_fun == NULL) return;
  pthread_mutex_lock(&images_lock);
  if ((table_used + 1) * 2 > table_size) grow();
  if (table_size != 0) {
    size_t j = slot_of(host_fun, table_size);
    while (table_keys[j] != NULL && table_keys[j] != host_fun) j = (j + 1) & (table_size - 1);
    if (table_keys[j] == NULL) table_used++;
    table_keys[j] = host_fun;
    table_sets[j] = (struct fg_image_set *)handle;
  }
  pthread_mutex_unlock(&images_lock);
}

int fg_image_version(const void *host_fun, int cc_major, int cc_minor) {
  int card = cc_major * 10 + cc_minor;
  struct fg_image_set *set = NULL;
  pthread_mutex_lock(&images_lock);
  if (table_size != 0 && host_fun != NULL) {
    size_t j = slot_of(host_fun, table_size);
    while (table_keys[j] != NULL && table_keys[j] != host_fun) j = (j + 1) & (table_size - 1);
    set = table_keys[j] == host_fun ? table_sets[j] : NULL;
  }
  pthread_mutex_unlock(&images_lock);
  if (set == NULL) return card;
  for (int minor = cc_minor; minor >= 0; minor--)
    if (has_arch(set->sass, cc_major * 10 + minor)) return cc_major * 10 + minor;
  for (int arch = card; arch >= 0; arch--)
    if (has_arch(set->ptx, arch)) return arch;
  return card;
}
