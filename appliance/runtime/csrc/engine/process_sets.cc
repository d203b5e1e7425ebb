// Process sets on a Runtime: the caller-side table (enqueue checks membership, root and splits
// against it) and the background thread's side (the coordinator's table on rank 0, and on every
// member a Comm view, with its own backends in the registry: a CPU backend, plus host staging
// for CUDA tensors, since NCCL communicators exist for the global set only).
//
// Order: add/remove queue a change under the queue lock; the background thread applies changes
// before the requests queued after them, so an op on a new set is always announced after the
// set exists on its rank. Across ranks the adapter makes add/remove collective (a global barrier
// after the change), so rank 0's coordinator knows a set before any member's request for it.
#include <algorithm>
#include <unistd.h>

#include <stdexcept>

#include "common/log.h"
#include "engine/runtime.h"

namespace appliance {

void Runtime::add_process_set(int32_t id, std::vector<int> members) {
  std::sort(members.begin(), members.end());
  if (id <= 0) throw std::invalid_argument("process set id " + std::to_string(id) + " is reserved (0 is the global set)");
  if (members.empty()) throw std::invalid_argument("a process set needs at least one rank");
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i] < 0 || members[i] >= cfg_.size || (i && members[i] == members[i - 1]))
      throw std::invalid_argument("process set ranks " + shape_str(std::vector<int64_t>(members.begin(), members.end())) +
                                  " are not distinct ranks below the job size " + std::to_string(cfg_.size));
  {
    std::lock_guard<std::mutex> g(callers_.mu);
    if (callers_.known_sets.count(id)) throw std::invalid_argument("process set " + std::to_string(id) + " exists already");
    callers_.known_sets[id] = members;
    callers_.auto_names.erase(id);  // a reused id starts its automatic names and groups afresh on its new members
    callers_.groups.erase(id);
    callers_.set_changes.push_back(SetChange{true, id, std::move(members)});
    sched_.post();
  }
  sched_.wake_always();
}

void Runtime::remove_process_set(int32_t id) {
  {
    std::lock_guard<std::mutex> g(callers_.mu);
    if (!callers_.known_sets.erase(id)) throw std::invalid_argument("process set " + std::to_string(id) + " is not registered");
    callers_.set_changes.push_back(SetChange{false, id, {}});
    sched_.post();
  }
  sched_.wake_always();
}

bool Runtime::process_set_members(int32_t id, std::vector<int>* members) {
  if (id == 0) {
    members->resize(static_cast<size_t>(cfg_.size));
    for (int r = 0; r < cfg_.size; ++r) (*members)[static_cast<size_t>(r)] = r;
    return true;
  }
  std::lock_guard<std::mutex> g(callers_.mu);
  auto it = callers_.known_sets.find(id);
  if (it == callers_.known_sets.end()) return false;
  *members = it->second;
  return true;
}

void Runtime::apply_set_changes(std::deque<SetChange>& changes) {
  for (SetChange& c : changes) {
    if (!c.add) {
      negotiator_->remove_process_set(c.id);
      backends_->remove_set(c.id);
      sets_.erase(c.id);
      continue;
    }
    negotiator_->add_process_set(c.id, c.members);
    if (!std::binary_search(c.members.begin(), c.members.end(), cfg_.rank)) continue;
    SetComm sc;
    sc.members = c.members;
    sc.comm = std::make_unique<Comm>(*comm_, c.members);
    backends_->add_set(c.id, *sc.comm);
    sets_[c.id] = std::move(sc);
  }
  changes.clear();
}

Runtime::SetComm* Runtime::set_comm(int32_t id) {
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : &it->second;
}

}  // namespace appliance
