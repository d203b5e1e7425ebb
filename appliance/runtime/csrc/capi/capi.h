// The C door's C++ side (capi/appliance_core.h is the door): the table of functions, and the
// process's runtime the door reaches. The bindings hand the table out (_core.c_api()) and set
// the runtime when Python starts or stops one (appliance/runtime/engine.py).
//
// The one piece of process-wide state in the core, on purpose: a framework's op library is
// loaded once per process and knows no Python object, so "the runtime" must be findable
// without one. The slot holds a reference: a Runtime lives while an operation submitted
// through the door may still need it (wait-based operations hold one too).
#pragma once

#include <memory>

#include "capi/appliance_core.h"
#include "engine/runtime.h"

namespace appliance {

const appliance_core_api* core_api();
// The runtime the door reaches (nullptr: none); returns the one it replaces.
std::shared_ptr<Runtime> set_process_runtime(std::shared_ptr<Runtime> rt);
std::shared_ptr<Runtime> process_runtime();

}  // namespace appliance
