/* A fake libnvidia-ml.so.1: PyTorch asks NVML about devices, processes and
 * links (and torch 2.13 with expandable segments calls nvmlInit_v2 through a
 * null pointer when the library is missing). Devices are found by index, PCI
 * bus id or UUID; process lists are empty; link queries answer "not
 * supported". Fabric queries answer as a card of the fake compute capability
 * (TORCHMEM_FAKEGPU_CC, default 9.0) would: from sm90 on, success with the
 * state "not supported" (a card outside any NVLink fabric); before sm90, the
 * call itself is not supported. Types are the C ABI's: enums as int, handles
 * as pointers. Every error return logs "failed NAME(ARGS) = NVML_ERROR_..."
 * to $TORCHMEM_FAKEGPU_LOG (../include/fg_log.h). */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../include/fg_log.h"

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25

static int devices[64];

static const char *return_name(nvmlReturn_t result) {
  switch (result) {
    case NVML_ERROR_INVALID_ARGUMENT: return "NVML_ERROR_INVALID_ARGUMENT";
    case NVML_ERROR_NOT_SUPPORTED: return "NVML_ERROR_NOT_SUPPORTED";
    case NVML_ERROR_NOT_FOUND: return "NVML_ERROR_NOT_FOUND";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "NVML_ERROR_ARGUMENT_VERSION_MISMATCH";
    default: return "NVML_ERROR_UNKNOWN";
  }
}

/* Every error return: logs the failed call under the calling function's name and returns result. */
__attribute__((format(printf, 4, 5))) static nvmlReturn_t fail(const char *entry, nvmlReturn_t result,
                                                               const char *why, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  fg_log_failed_line(getenv("TORCHMEM_FAKEGPU_LOG"), entry, return_name(result), why, fmt, args);
  va_end(args);
  return result;
}
#define NVML_FAIL(result, ...) fail(__func__, (result), NULL, __VA_ARGS__)
#define NVML_FAIL_WHY(result, why, ...) fail(__func__, (result), (why), __VA_ARGS__)

static int device_count(void) {
  const char *value = getenv("TORCHMEM_FAKEGPU_DEVICES");
  int n = value ? atoi(value) : 1;
  return n < 1 ? 1 : n > 64 ? 64 : n;
}

nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlInit(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return NVML_SUCCESS; }
nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

const char *nvmlErrorString(nvmlReturn_t result) {
  return result == NVML_SUCCESS ? "Success" : result == NVML_ERROR_NOT_SUPPORTED ? "Not Supported" : "Error";
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
  if (count == NULL) return NVML_FAIL(NVML_ERROR_INVALID_ARGUMENT, "count=NULL");
  *count = (unsigned)device_count();
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
  if (device == NULL || (int)index >= device_count())
    return NVML_FAIL(NVML_ERROR_INVALID_ARGUMENT, "index=%u, device=%p", index, (void *)device);
  *device = &devices[index];
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, void **device) {
  unsigned domain = 0, bus = 0;
  if (device == NULL || bus_id == NULL || sscanf(bus_id, "%x:%x", &domain, &bus) != 2)
    return NVML_FAIL(NVML_ERROR_INVALID_ARGUMENT, "bus_id=%s, device=%p", bus_id ? bus_id : "NULL", (void *)device);
  if (bus < 1 || (int)bus > device_count())
    return NVML_FAIL(NVML_ERROR_NOT_FOUND, "bus_id=%s, device=%p", bus_id, (void *)device);
  *device = &devices[bus - 1];
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(void *device, char *uuid, unsigned int length) {
  if (device == NULL || uuid == NULL)
    return NVML_FAIL(NVML_ERROR_INVALID_ARGUMENT, "device=%p, uuid=%p, length=%u", device, (void *)uuid, length);
  snprintf(uuid, length, "GPU-fa4e0000-0000-0000-0000-%012d", (int)((int *)device - devices));
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, void **device) {
  int index = 0;
  if (uuid == NULL || device == NULL || sscanf(uuid, "GPU-fa4e0000-0000-0000-0000-%d", &index) != 1 ||
      index >= device_count())
    return NVML_FAIL(NVML_ERROR_NOT_FOUND, "uuid=%s, device=%p", uuid ? uuid : "NULL", (void *)device);
  *device = &devices[index];
  return NVML_SUCCESS;
}

/* Both process lists', under the caller's name: no process uses the fake card. */
static nvmlReturn_t running_processes(const char *entry, void *device, unsigned int *count, void *infos) {
  if (count == NULL)
    return fail(entry, NVML_ERROR_INVALID_ARGUMENT, NULL, "device=%p, count=NULL, infos=%p", device, infos);
  *count = 0;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(void *device, unsigned int *count, void *infos) {
  return running_processes(__func__, device, count, infos);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *count, void *infos) {
  return running_processes(__func__, device, count, infos);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
  if (version == NULL) return NVML_FAIL(NVML_ERROR_INVALID_ARGUMENT, "version=NULL");
  *version = 13000;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(void *device, unsigned int link, int *type) {
  (void)type;
  return NVML_FAIL_WHY(NVML_ERROR_NOT_SUPPORTED, "no NVLink", "device=%p, link=%u", device, link);
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(void *device, unsigned int link, void *pci) {
  (void)pci;
  return NVML_FAIL_WHY(NVML_ERROR_NOT_SUPPORTED, "no NVLink", "device=%p, link=%u", device, link);
}

nvmlReturn_t nvmlDeviceGetNvLinkState(void *device, unsigned int link, int *active) {
  (void)active;
  return NVML_FAIL_WHY(NVML_ERROR_NOT_SUPPORTED, "no NVLink", "device=%p, link=%u", device, link);
}

nvmlReturn_t nvmlDeviceGetP2PStatus(void *a, void *b, int index, int *status) {
  (void)status;
  return NVML_FAIL_WHY(NVML_ERROR_NOT_SUPPORTED, "no peer-to-peer status", "a=%p, b=%p, index=%d", a, b, index);
}

/* Fabric info (nvml.h's nvmlGpuFabricInfo_t and nvmlGpuFabricInfoV_t). A
 * versioned struct's version is its size | (version << 24): v2 ends after
 * healthMask, v3 adds healthSummary. PyTorch's CUDA allocator asks for it when
 * it picks the handle type of expandable segments, and warns once
 * ("nvmlDeviceGetGpuFabricInfoV failed. This function is only supported on
 * sm90+") when the call fails. */
#define NVML_GPU_FABRIC_UUID_LEN 16
#define NVML_GPU_FABRIC_STATE_NOT_SUPPORTED 0

typedef struct {
  unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
  nvmlReturn_t status;
  unsigned int cliqueId;
  unsigned char state;
} fabric_info_v1;

typedef struct {
  unsigned int version;
  unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
  nvmlReturn_t status;
  unsigned int cliqueId;
  unsigned char state;
  unsigned int healthMask;
  unsigned char healthSummary; /* v3 only */
} fabric_info_v;

#define FABRIC_INFO_V2 ((unsigned)offsetof(fabric_info_v, healthSummary) | (2u << 24))
#define FABRIC_INFO_V3 ((unsigned)sizeof(fabric_info_v) | (3u << 24))

/* Whether the fake card is sm90 or newer, where NVML answers fabric queries. */
static int fabric_queries_supported(void) {
  const char *cc = getenv("TORCHMEM_FAKEGPU_CC");
  int major = 9, minor = 0;
  if (cc != NULL && sscanf(cc, "%d.%d", &major, &minor) != 2) major = 9;
  return major >= 9;
}

static int known_device(const void *device) {
  const int *d = (const int *)device;
  return d >= devices && d < devices + device_count();
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(void *device, void *info) {
  if (!known_device(device) || info == NULL)
    return NVML_FAIL(NVML_ERROR_INVALID_ARGUMENT, "device=%p, info=%p", device, info);
  if (!fabric_queries_supported())
    return NVML_FAIL_WHY(NVML_ERROR_NOT_SUPPORTED, "a card before sm90", "device=%p, info=%p", device, info);
  fabric_info_v *out = (fabric_info_v *)info;
  unsigned version = out->version;
  if (version != FABRIC_INFO_V2 && version != FABRIC_INFO_V3)
    return NVML_FAIL(NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "device=%p, info=%p, version=0x%x", device, info, version);
  memset((char *)info + sizeof out->version, 0, (version & 0xffffffu) - sizeof out->version);
  out->status = NVML_SUCCESS;
  out->state = NVML_GPU_FABRIC_STATE_NOT_SUPPORTED;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(void *device, void *info) {
  if (!known_device(device) || info == NULL)
    return NVML_FAIL(NVML_ERROR_INVALID_ARGUMENT, "device=%p, info=%p", device, info);
  if (!fabric_queries_supported())
    return NVML_FAIL_WHY(NVML_ERROR_NOT_SUPPORTED, "a card before sm90", "device=%p, info=%p", device, info);
  fabric_info_v1 *out = (fabric_info_v1 *)info;
  memset(out, 0, sizeof *out);
  out->status = NVML_SUCCESS;
  out->state = NVML_GPU_FABRIC_STATE_NOT_SUPPORTED;
  return NVML_SUCCESS;
}
