// The deadlock check: which waiting ranks wait on each other forever (see deadlock.h).
#include "coordinator/deadlock.h"

#include <algorithm>
#include <map>

namespace appliance {

PendingOp PendingOp::of(const Request& req, int size) {
  PendingOp p;
  p.name = req.name;
  p.kind = req.sig.kind;
  p.set = req.sig.process_set;
  p.root = req.sig.root;
  p.group_id = req.sig.group_size > 1 ? req.sig.group_id : 0;
  p.ready.assign(static_cast<size_t>(size), 0);
  return p;
}

std::vector<int> find_deadlock(const std::vector<PendingOp>& ops, const std::vector<int>& candidates,
                               const std::function<const std::vector<int>*(int32_t)>& members,
                               const std::vector<uint8_t>& joined, const std::vector<uint8_t>& left) {
  std::vector<uint8_t> in(joined.size(), 0);
  for (int r : candidates) in[r] = 1;
  std::vector<uint8_t> can(ops.size(), 0);
  for (bool changed = true; changed;) {
    changed = false;
    // Which operations could still complete with the group as it stands.
    std::map<std::pair<int32_t, uint32_t>, bool> groups;
    for (size_t i = 0; i < ops.size(); ++i) {
      const PendingOp& op = ops[i];
      bool ok = true;
      if (const std::vector<int>* m = members(op.set))  // an unknown set fails its operations at once
        for (int r : *m) {
          if (op.ready[r] || left[r] || !in[r]) continue;  // ready, gone, or may still submit it
          if (op.kind != OpKind::kJoin && op.set == 0 && joined[r]) continue;  // counted as ready
          ok = false;
          break;
        }
      can[i] = ok;
      if (op.group_id) {
        auto it = groups.emplace(std::make_pair(op.set, op.group_id), true).first;
        it->second = it->second && ok;
      }
    }
    for (size_t i = 0; i < ops.size(); ++i)
      if (ops[i].group_id && !groups[{ops[i].set, ops[i].group_id}]) can[i] = 0;
    // A rank leaves the group when something it waits on could complete, or when it waits on
    // nothing this check knows of (its request is on its way).
    for (int r : candidates) {
      if (!in[r]) continue;
      bool waits = false, could = false;
      for (size_t i = 0; i < ops.size() && !could; ++i)
        if (ops[i].ready[r]) {
          waits = true;
          could = can[i];
        }
      if (!waits || could) {
        in[r] = 0;
        changed = true;
      }
    }
  }
  std::vector<int> out;
  for (size_t r = 0; r < in.size(); ++r)
    if (in[r]) out.push_back(static_cast<int>(r));
  return out;
}

std::vector<std::string> describe_waits(const std::vector<PendingOp>& ops, const std::vector<int>& ranks) {
  constexpr int kMaxListed = 8;
  std::vector<std::string> lines;
  for (int r : ranks) {
    std::string line = "rank " + std::to_string(r) + " waits on: ";
    int listed = 0, more = 0;
    for (const PendingOp& op : ops) {
      if (!op.ready[r]) continue;
      if (listed == kMaxListed) {
        ++more;
        continue;
      }
      if (listed++) line += ", ";
      if (op.kind == OpKind::kJoin) {
        line += "join";
        continue;
      }
      line += std::string(op_kind_name(op.kind)) + " '" + op.name + "'";
      if (op.kind == OpKind::kBroadcast) line += " (root " + std::to_string(op.root) + ")";
      if (op.set != 0) line += " in process set " + std::to_string(op.set);
    }
    if (more) line += " and " + std::to_string(more) + " more";
    lines.push_back(std::move(line));
  }
  return lines;
}

WaitingRanks::WaitingRanks(int size, double deadlock_s)
    : settle_(std::chrono::duration_cast<Time::duration>(std::chrono::duration<double>(deadlock_s))),
      ranks_(static_cast<size_t>(size)) {}

void WaitingRanks::waiting(int rank, Time since, std::vector<Request> also) {
  Rank& r = ranks_[rank];
  if (!r.waiting) ++count_;
  r.waiting = true;
  r.quiet = since;
  r.also = std::move(also);
  dirty_ = true;
}

void WaitingRanks::not_waiting(int rank) {
  Rank& r = ranks_[rank];
  if (!r.waiting) return;
  --count_;
  r = Rank{};
  dirty_ = true;
}

void WaitingRanks::progress(const std::vector<int>& ranks, Time now) {
  if (!count_) return;
  for (int x : ranks) {
    Rank& r = ranks_[x];
    if (r.waiting && r.quiet < now) {
      r.quiet = now;
      dirty_ = true;
    }
  }
}

WaitingRanks::Time WaitingRanks::settles(const Rank& r) const {
  return r.quiet > Time::max() - settle_ ? Time::max() : r.quiet + settle_;
}

std::vector<int> WaitingRanks::settled(Time now) const {
  std::vector<int> out;
  for (size_t i = 0; i < ranks_.size(); ++i)
    if (ranks_[i].waiting && settles(ranks_[i]) <= now) out.push_back(static_cast<int>(i));
  return out;
}

WaitingRanks::Time WaitingRanks::next_check() const {
  if (!count_) return Time::max();
  if (dirty_) return Time{};
  Time t = Time::max();
  for (const Rank& r : ranks_)
    if (r.waiting && settles(r) > checked_) t = std::min(t, settles(r));
  return t;
}

void WaitingRanks::checked(Time now) {
  dirty_ = false;
  checked_ = now;
}

}  // namespace appliance
