/* appliance_core.h: the C door into the collective core, for framework bindings that are shared
 * objects of their own (the TensorFlow op library) and cannot link the core inside the Python
 * module appliance.runtime._core.
 *
 * A process has one runtime, whichever framework calls it: the one appliance.runtime.engine
 * started (hvd.init()). The door reaches it through a table of functions, versioned
 * (abi_version; fields are only ever appended, size_of tells how many there are), which
 * _core.c_api() hands out as a PyCapsule named APPLIANCE_CORE_CAPSULE. Plain C: no C++ type
 * crosses it, so a binding built with another compiler or standard library works.
 *
 * An operation is submitted on raw host pointers with its dtype and shape. Two ways to learn
 * its end:
 *  - a completion callback (done != NULL): called once per operation, on a core thread (or on
 *    the submitting thread, when the runtime refuses work), after the operation is complete;
 *    it receives the operation, which stays valid until release(). It must not block.
 *  - wait/poll (done == NULL): submit fills ops[], then wait() blocks until done.
 * Outputs whose size is known only after negotiation (allgather, alltoall, reducescatter) are
 * kept by the core: output() gives their shape and bytes, valid until release().
 *
 * Failure modes: submit refuses an operation (no runtime, a bad argument, a name in flight)
 * with a message in err; an operation that fails later (a lost peer, a mismatch, shutdown)
 * completes with a status whose ok is 0, naming its origin rank.
 */
#ifndef APPLIANCE_CORE_H
#define APPLIANCE_CORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define APPLIANCE_CORE_ABI_VERSION 1
#define APPLIANCE_CORE_CAPSULE "appliance_core_api"

/* Element types, reductions and kinds: the core's own codes (common/types.h). */
enum {
  APPLIANCE_UINT8 = 0, APPLIANCE_INT8 = 1, APPLIANCE_INT16 = 2, APPLIANCE_INT32 = 3, APPLIANCE_INT64 = 4,
  APPLIANCE_FLOAT16 = 5, APPLIANCE_BFLOAT16 = 6, APPLIANCE_FLOAT32 = 7, APPLIANCE_FLOAT64 = 8, APPLIANCE_BOOL = 9
};
enum { APPLIANCE_AVERAGE = 0, APPLIANCE_SUM = 1, APPLIANCE_ADASUM = 2, APPLIANCE_MIN = 3, APPLIANCE_MAX = 4, APPLIANCE_PRODUCT = 5 };
enum {
  APPLIANCE_ALLREDUCE = 0, APPLIANCE_ALLGATHER = 1, APPLIANCE_BROADCAST = 2, APPLIANCE_ALLTOALL = 3,
  APPLIANCE_REDUCESCATTER = 4, APPLIANCE_BARRIER = 5, APPLIANCE_JOIN = 6
};
/* Status codes (common/status.h): 0 ok; MISMATCH and INVALID are the caller's, the rest the job's. */
enum {
  APPLIANCE_OK = 0, APPLIANCE_PEER_LOST = 1, APPLIANCE_TIMEOUT = 2, APPLIANCE_MISMATCH = 3, APPLIANCE_PROTOCOL = 4,
  APPLIANCE_AUTH = 5, APPLIANCE_INVALID = 6, APPLIANCE_ABORTED = 7, APPLIANCE_INTERNAL = 8, APPLIANCE_SHUTDOWN = 9,
  APPLIANCE_STALLED = 10
};

/* One operation as submitted. Unused fields are zero (a zeroed struct is a valid allreduce
 * Sum of nothing); prescale/postscale 0 mean 1. */
typedef struct appliance_core_request {
  int32_t kind;
  int32_t reduce_op;    /* allreduce, reducescatter */
  double prescale;      /* allreduce, reducescatter: applied before / after the reduction */
  double postscale;
  int32_t root;         /* broadcast: rank within the process set */
  int32_t process_set;  /* 0: every rank */
  const char* name;     /* NULL or "": the core names it; the same on every rank otherwise */
  const void* data;     /* input */
  void* out;            /* allreduce, broadcast: where the result goes (may be data) */
  int32_t dtype;
  int32_t ndim;
  const int64_t* shape;
  const int64_t* splits; /* alltoall: rows to each rank (nsplits == the set's size), or none */
  int32_t nsplits;
  int32_t device;       /* -1: host memory (the only kind with core-allocated outputs) */
  uint64_t stream;      /* CUDA stream of device memory */
} appliance_core_request;

typedef struct appliance_core_op appliance_core_op; /* opaque: one submitted operation */

typedef struct appliance_core_status {
  int32_t ok;          /* 1: done without error */
  int32_t code;        /* APPLIANCE_OK ... APPLIANCE_STALLED */
  int32_t origin_rank; /* the rank the failure is about, or -1 */
  const char* code_name;
  const char* origin_host;
  const char* message; /* one line naming the operation, ranks and cause */
} appliance_core_status;

/* What an operation hands back beyond the caller's memory (all zero when nothing). */
typedef struct appliance_core_output {
  int32_t ndim;
  const int64_t* shape; /* elements per dimension */
  const void* data;     /* core-allocated output (allgather, alltoall, reducescatter) */
  size_t bytes;
  int32_t nsplits;      /* alltoall: rows received from each rank */
  const int64_t* splits;
  int64_t value;        /* join: the last rank to join */
} appliance_core_output;

typedef struct appliance_core_topology {
  int32_t rank, size, local_rank, local_size, cross_rank, cross_size;
} appliance_core_topology;

/* index: the operation's place in its submit() call. Strings in status live until release(op). */
typedef void (*appliance_core_done)(void* user, int32_t index, appliance_core_op* op,
                                    const appliance_core_status* status);

typedef struct appliance_core_api {
  uint32_t abi_version; /* APPLIANCE_CORE_ABI_VERSION of the core */
  uint32_t size_of;     /* sizeof(appliance_core_api) of the core: fields beyond it are absent */

  /* The process's runtime layout: 1, or 0 when no runtime is running (before hvd.init()). */
  int32_t (*topology)(appliance_core_topology* out);
  /* Whether process set `id` is registered and this rank is in it (1), not in it (0), or
   * unknown (-1); *size receives its size when known. */
  int32_t (*process_set)(int32_t id, int32_t* size, int32_t* rank);

  /* Submits n operations (n > 1: the members of one group, scheduled together). Returns how
   * many were enqueued: n, or fewer with the reason in err (the first refused one; those
   * before it complete as usual). With done, each enqueued operation calls it once and ops
   * may be NULL; without, ops[i] receives operation i for wait(). */
  int32_t (*submit)(const appliance_core_request* reqs, int32_t n, appliance_core_done done, void* user,
                    appliance_core_op** ops, char* err, size_t err_len);
  /* 1 when done (never blocks). */
  int32_t (*poll)(appliance_core_op* op);
  /* Blocks until done; fills status (strings live until release). */
  void (*wait)(appliance_core_op* op, appliance_core_status* status);
  /* What a done operation hands back. */
  void (*output)(appliance_core_op* op, appliance_core_output* out);
  /* Forgets the operation (after its callback, or after wait); its output memory goes back. */
  void (*release)(appliance_core_op* op);
} appliance_core_api;

#ifdef __cplusplus
}
#endif

#endif /* APPLIANCE_CORE_H */
