/* A stand-in libnccl.so.2 for tests without a GPU: reports FAKE_NCCL_VERSION (a compile-time
 * define). With -DONLY_VERSION it has nothing else (an incomplete library). Otherwise every
 * call the core binds exists; with -DSOLO a one-rank communicator works, its collectives being
 * the copies (and the pre-multiplied sum's scaling, float32/float64) one rank amounts to, on
 * the stand-in CUDA runtime's host "device" memory; without it, creating a communicator fails
 * with "fake NCCL: no GPU here", so a job that chooses NCCL must end with that error on every
 * rank instead of hanging. */
#include <stddef.h>
#include <string.h>

int ncclGetVersion(int* v) { *v = FAKE_NCCL_VERSION; return 0; }
#ifndef ONLY_VERSION
#define FAIL { return 1; }
int ncclGetUniqueId(void* id) { (void)id; return 0; }
typedef struct { char internal[128]; } ncclUniqueId;
#ifdef SOLO
static double scalars[64];
static int nops = 0;
static size_t esize(int t) { return t <= 1 ? 1 : t <= 3 ? 4 : t <= 5 ? 8 : t == 6 || t == 9 ? 2 : t == 7 ? 4 : 8; }
static void apply(void* out, const void* in, size_t count, int type, int op) {
  if (out != in) memmove(out, in, count * esize(type));
  if (op < 5) return;  /* Sum/Prod/Max/Min/Avg of one rank: the input itself */
  double f = scalars[op - 5];
  if (type == 7) for (size_t i = 0; i < count; ++i) ((float*)out)[i] = (float)(((float*)out)[i] * f);
  if (type == 8) for (size_t i = 0; i < count; ++i) ((double*)out)[i] *= f;
}
int ncclCommInitRank(void** c, int n, ncclUniqueId id, int r) { (void)id; (void)r; *c = (void*)&nops; return n == 1 ? 0 : 1; }
int ncclAllReduce(const void* s, void* d, size_t n, int t, int op, void* c, void* st) { (void)c; (void)st; apply(d, s, n, t, op); return 0; }
int ncclBroadcast(const void* s, void* d, size_t n, int t, int root, void* c, void* st) { (void)root; (void)c; (void)st; apply(d, s, n, t, 0); return 0; }
int ncclReduce(const void* s, void* d, size_t n, int t, int op, int root, void* c, void* st) { (void)root; (void)c; (void)st; apply(d, s, n, t, op); return 0; }
int ncclAllGather(const void* s, void* d, size_t n, int t, void* c, void* st) { (void)c; (void)st; apply(d, s, n, t, 0); return 0; }
int ncclReduceScatter(const void* s, void* d, size_t n, int t, int op, void* c, void* st) { (void)c; (void)st; apply(d, s, n, t, op); return 0; }
int ncclSend() FAIL
int ncclRecv() FAIL
int ncclRedOpCreatePreMulSum(int* op, void* scalar, int type, int residence, void* c) {
  (void)residence; (void)c;
  scalars[nops % 64] = type == 8 ? *(double*)scalar : type == 7 ? *(float*)scalar : 1.0;
  *op = 5 + nops++ % 64;
  return 0;
}
#else
int ncclCommInitRank(void** c, int n, ncclUniqueId id, int r) { (void)c; (void)n; (void)id; (void)r; return 1; }
int ncclAllReduce() FAIL
int ncclBroadcast() FAIL
int ncclReduce() FAIL
int ncclAllGather() FAIL
int ncclReduceScatter() FAIL
int ncclSend() FAIL
int ncclRecv() FAIL
int ncclRedOpCreatePreMulSum() FAIL
#endif
int ncclCommDestroy(void* c) { (void)c; return 0; }
int ncclCommAbort(void* c) { (void)c; return 0; }
int ncclCommGetAsyncError(void* c, int* e) { (void)c; *e = 0; return 0; }
int ncclGroupStart() { return 0; }
int ncclGroupEnd() { return 0; }
int ncclRedOpDestroy() { return 0; }
const char* ncclGetErrorString(int e) { (void)e; return "fake NCCL: no GPU here"; }
#endif
