/* A stand-in libnccl.so.2 for loader tests: reports FAKE_NCCL_VERSION (a compile-time
 * define). With -DONLY_VERSION it has nothing else (an incomplete library); otherwise every
 * call the core binds exists and fails with "fake NCCL: no GPU here", so a job that chooses
 * NCCL must end with that error on every rank instead of hanging. */
#include <stddef.h>

int ncclGetVersion(int* v) { *v = FAKE_NCCL_VERSION; return 0; }
#ifndef ONLY_VERSION
#define FAIL { return 1; }
int ncclGetUniqueId(void* id) { (void)id; return 0; }
typedef struct { char internal[128]; } ncclUniqueId;
int ncclCommInitRank(void** c, int n, ncclUniqueId id, int r) { (void)c; (void)n; (void)id; (void)r; return 1; }
int ncclCommDestroy(void* c) { (void)c; return 0; }
int ncclCommAbort(void* c) { (void)c; return 0; }
int ncclCommGetAsyncError(void* c, int* e) { (void)c; *e = 0; return 0; }
int ncclAllReduce() FAIL
int ncclBroadcast() FAIL
int ncclReduce() FAIL
int ncclAllGather() FAIL
int ncclReduceScatter() FAIL
int ncclSend() FAIL
int ncclRecv() FAIL
int ncclGroupStart() { return 0; }
int ncclGroupEnd() { return 0; }
int ncclRedOpCreatePreMulSum() FAIL
int ncclRedOpDestroy() { return 0; }
const char* ncclGetErrorString(int e) { (void)e; return "fake NCCL: no GPU here"; }
#endif
