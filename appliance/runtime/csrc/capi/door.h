// The door's work on a given Runtime: the one path from a described operation to core work and
// back, for every framework. The C table (capi.cc, appliance_core.h) runs it on the process's
// runtime for op libraries that are shared objects of their own (TensorFlow's); the pybind11
// binding (bindings/) runs it on the Runtime Python called, so the two cannot drift: grouping,
// enqueue, refusals, waiting (and the wait metrics), status and outputs are done here once.
//
// A caller reads its own format into the core's Request and TensorDescs (describe() for the C
// struct; the binding reads Python tuples) and hands them to submit(); handles come back as the
// core's ints (the HandleTable checks them: an unknown one is refused, never undefined).
//
// Failure modes: submit() and wait() never throw; a refusal (a bad argument, a name in flight,
// an unknown handle) is returned as its one-line message. A failed operation completes with a
// Status naming its origin rank (status()).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "capi/appliance_core.h"
#include "engine/runtime.h"

namespace appliance {
namespace door {

// The C request's fields as the core's Request and tensors; std::invalid_argument naming the
// bad field. Core-allocated outputs are host memory here (output() has no device form).
void describe(const appliance_core_request& r, Request* q, TensorDesc* in, TensorDesc* out);

// Enqueues qs[0..n); with `group`, as the members of one new group (scheduled together). With on_done,
// operation i completes by on_done(i)'s function and handles may be null; without, handles[i]
// receives its handle for wait(). Returns how many were enqueued: n, or fewer with the first
// refusal's message in *err (those before it complete as usual).
using Completion = std::function<void(const OpPtr&)>;
int32_t submit(Runtime& rt, Request* qs, TensorDesc* ins, TensorDesc* outs, int32_t n, bool group, int* handles,
               std::string* err, const std::function<Completion(int32_t)>& on_done = nullptr);

// Waits for every one of handles[0..n), even after one failed (their memory is in use until
// then), counting the time into rt's metrics (busy, wait). stream < 0: until each is done;
// a CUDA stream handle: until done, or until its device work is queued on that stream and the
// stream made to wait for it (finished[i] 0). ops[i] receives each operation (null: refused).
// Returns the index of the first that failed or was refused (n: none), its refusal in *refused.
int32_t wait(Runtime& rt, const int* handles, int32_t n, int64_t stream, OpPtr* ops, char* finished,
             std::string* refused);

// Never blocks: whether the operation is done; std::invalid_argument for an unknown handle.
inline bool poll(Runtime& rt, int handle) { return rt.poll(handle); }

// A done operation's status; strings point into op and *message (kept by the caller).
void status(const OpState& op, std::string* message, appliance_core_status* st);
// What a done, successful operation hands back beyond the caller's memory (host outputs kept
// by the core: valid while op lives; join's value; alltoall's received splits). All zero else.
void output(const OpState& op, appliance_core_output* out);

}  // namespace door
}  // namespace appliance
