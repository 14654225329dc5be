/* A fake libnvidia-ml.so.1: PyTorch asks NVML about devices, processes and
 * links (and torch 2.13 with expandable segments calls nvmlInit_v2 through a
 * null pointer when the library is missing). Devices are found by index, PCI
 * bus id or UUID; process lists are empty; link and fabric queries answer
 * "not supported". Types are the C ABI's: enums as int, handles as pointers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6

static int devices[64];

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
  if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  *count = (unsigned)device_count();
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
  if (device == NULL || (int)index >= device_count()) return NVML_ERROR_INVALID_ARGUMENT;
  *device = &devices[index];
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, void **device) {
  unsigned domain = 0, bus = 0;
  if (device == NULL || bus_id == NULL || sscanf(bus_id, "%x:%x", &domain, &bus) != 2) return NVML_ERROR_INVALID_ARGUMENT;
  if (bus < 1 || (int)bus > device_count()) return NVML_ERROR_NOT_FOUND;
  *device = &devices[bus - 1];
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(void *device, char *uuid, unsigned int length) {
  if (device == NULL || uuid == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  snprintf(uuid, length, "GPU-fa4e0000-0000-0000-0000-%012d", (int)((int *)device - devices));
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, void **device) {
  int index = 0;
  if (uuid == NULL || device == NULL || sscanf(uuid, "GPU-fa4e0000-0000-0000-0000-%d", &index) != 1 ||
      index >= device_count())
    return NVML_ERROR_NOT_FOUND;
  *device = &devices[index];
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(void *device, unsigned int *count, void *infos) {
  (void)device, (void)infos;
  if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  *count = 0;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *count, void *infos) {
  return nvmlDeviceGetComputeRunningProcesses(device, count, infos);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
  if (version == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  *version = 13000;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(void *device, unsigned int link, int *type) {
  (void)device, (void)link, (void)type;
  return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(void *device, unsigned int link, void *pci) {
  (void)device, (void)link, (void)pci;
  return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(void *device, unsigned int link, int *active) {
  (void)device, (void)link, (void)active;
  return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetP2PStatus(void *a, void *b, int index, int *status) {
  (void)a, (void)b, (void)index, (void)status;
  return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(void *device, void *info) {
  (void)device, (void)info;
  return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(void *device, void *info) {
  (void)device, (void)info;
  return NVML_ERROR_NOT_SUPPORTED;
}
