/* A stand-in CUDA runtime for tests on machines without a GPU: "device" memory is host
 * memory, copies are memcpy, streams and events complete at once. Exercises the core's loader
 * and the engine's CUDA path (store exchange, NCCL/staging decision, staging copies) with real
 * processes. FAKE_CUDA_DEVICES (default 1) devices; FAKE_CUDA_BUS is device 0's PCI bus id;
 * FAKE_CUDA_EVENT_POLLS=N makes every event report "not ready" to its first N queries (device
 * work that takes a while). fake_stream_waits() counts cudaStreamWaitEvent calls;
 * fake_events_outstanding() counts such events not yet queried to completion. */
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

static int devices(void) { const char* s = getenv("FAKE_CUDA_DEVICES"); return s ? atoi(s) : 1; }
static __thread int current = 0;

int cudaGetDeviceCount(int* n) { *n = devices(); return *n > 0 ? 0 : 100; }
int cudaGetDevice(int* d) { *d = current; return 0; }
int cudaSetDevice(int d) { if (d < 0 || d >= devices()) return 101; current = d; return 0; }
int cudaDeviceGetPCIBusId(char* out, int len, int d) {
  const char* bus = getenv("FAKE_CUDA_BUS");
  snprintf(out, (size_t)len, "%s.%d", bus ? bus : "0000:01:00", d);
  return 0;
}
int cudaRuntimeGetVersion(int* v) { *v = 13000; return 0; }
static int waits = 0, outstanding = 0;
int fake_stream_waits(void) { return __atomic_load_n(&waits, __ATOMIC_SEQ_CST); }
int fake_events_outstanding(void) { return __atomic_load_n(&outstanding, __ATOMIC_SEQ_CST); }
int cudaEventCreateWithFlags(void** e, unsigned f) { (void)f; *e = calloc(1, sizeof(int)); return 0; }
int cudaEventRecord(void* e, void* s) {
  const char* n = getenv("FAKE_CUDA_EVENT_POLLS");
  (void)s; *(int*)e = n ? atoi(n) : 0;
  if (*(int*)e > 0) __atomic_add_fetch(&outstanding, 1, __ATOMIC_SEQ_CST);
  return 0;
}
int cudaEventQuery(void* e) {
  int* left = (int*)e;
  if (*left > 1) { --*left; return 600; }
  if (*left == 1) { *left = 0; __atomic_sub_fetch(&outstanding, 1, __ATOMIC_SEQ_CST); }
  return 0;
}
int cudaEventDestroy(void* e) { free(e); return 0; }
int cudaStreamWaitEvent(void* s, void* e, unsigned f) { (void)s; (void)e; (void)f; __atomic_add_fetch(&waits, 1, __ATOMIC_SEQ_CST); return 0; }
int cudaStreamSynchronize(void* s) { (void)s; return 0; }
int cudaMemcpyAsync(void* d, const void* s, size_t n, int k, void* st) { (void)k; (void)st; memmove(d, s, n); return 0; }
int cudaMemsetAsync(void* d, int v, size_t n, void* st) { (void)st; memset(d, v, n); return 0; }
int cudaMalloc(void** p, size_t n) { *p = malloc(n); return *p ? 0 : 2; }
int cudaFree(void* p) { free(p); return 0; }
int cudaMallocHost(void** p, size_t n) { return cudaMalloc(p, n); }
int cudaFreeHost(void* p) { free(p); return 0; }
const char* cudaGetErrorString(int e) { return e == 100 ? "no CUDA-capable device is detected (fake)" : "fake CUDA error"; }
