// Timeline recorder and writer (see timeline.h for the file layout).
#include "engine/timeline.h"

#include <cctype>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "common/log.h"

namespace appliance {

namespace {
using std::chrono::duration_cast;
using std::chrono::microseconds;

std::string upper(const char* s) {
  std::string u(s);
  for (char& c : u) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return u;
}

void append_json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

bool has_op_phase(OpKind k) { return k != OpKind::kBarrier && k != OpKind::kJoin; }
}  // namespace

int64_t Timeline::now_us() const { return duration_cast<microseconds>(std::chrono::steady_clock::now() - t0_).count(); }

std::string Timeline::path() const {
  std::lock_guard<std::mutex> g(mu_);
  return path_;
}

void Timeline::start(const std::string& path, bool mark_cycles) {
  if (rank_ != 0) return;
  std::lock_guard<std::mutex> c(ctl_);
  if (writer_.joinable() && on()) {
    std::lock_guard<std::mutex> g(mu_);
    if (path == path_) {  // as Horovod: the file being written goes on
      mark_cycles_ = mark_cycles;
      return;
    }
  }
  stop_locked();
  if (path.empty()) throw std::invalid_argument("the timeline needs a file path");
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw std::invalid_argument("cannot write the timeline to '" + path + "': " + std::strerror(errno));
  const int64_t epoch_us = duration_cast<microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  {
    std::lock_guard<std::mutex> g(mu_);
    tracks_.clear();
    queue_.clear();
    dropped_ = 0;
    closing_ = false;
    mark_cycles_ = mark_cycles;
    path_ = path;
    t0_ = std::chrono::steady_clock::now();
  }
  writer_ = std::thread([this, f, epoch_us] { writer_loop(f, epoch_us); });
  on_.store(true);
}

void Timeline::stop() {
  std::lock_guard<std::mutex> c(ctl_);
  stop_locked();
}

void Timeline::stop_locked() {
  if (!writer_.joinable()) return;
  on_.store(false);
  {
    std::lock_guard<std::mutex> g(mu_);
    const int64_t ts = now_us();
    for (auto& kv : tracks_) {
      Track& t = kv.second;
      if (t.op != Phase::kNone) {
        end_activity(kv.first, t, ts);
        push(Rec{'E', 0, -1, {}, kv.first, "\"stopped\": true", ts});
      }
      if (t.negotiating) push(Rec{'E', t.neg_tid, -1, {}, kv.first, "\"stopped\": true", ts});
    }
    tracks_.clear();
    closing_ = true;
  }
  cv_.notify_all();
  writer_.join();
  std::lock_guard<std::mutex> g(mu_);
  path_.clear();
}

void Timeline::push(Rec&& r) {
  if (queue_.size() >= kQueueLimit) {
    ++dropped_;
    return;
  }
  queue_.push_back(std::move(r));
}

void Timeline::end_activity(const std::string& name, Track& t, int64_t ts) {
  if (t.op != Phase::kActivity) return;
  push(Rec{'E', 0, -1, {}, name, {}, ts});
  t.op = Phase::kOp;
}

void Timeline::negotiate(const std::string& name, OpKind kind, int rank) {
  std::lock_guard<std::mutex> g(mu_);
  if (!on()) return;
  const int64_t ts = now_us();
  Track& t = tracks_[name];
  if (!t.negotiating) {
    t.negotiating = true;
    t.neg_tid = t.op == Phase::kNone ? 0 : 1;  // the previous operation of this name still runs
    push(Rec{'B', t.neg_tid, -1, "NEGOTIATE_" + upper(op_kind_name(kind)), name, {}, ts});
  }
  push(Rec{'X', t.neg_tid, rank, {}, name, {}, ts});
}

void Timeline::planned(const std::vector<PlanEntry>& entries, const std::function<bool(const std::string&)>& runs) {
  std::lock_guard<std::mutex> g(mu_);
  if (!on()) return;
  const int64_t ts = now_us();
  for (const PlanEntry& e : entries) {
    std::string args;
    if (!e.ok) {
      args = "\"error\": ";
      append_json_string(args, e.error);
    }
    for (const std::string& name : e.names) {
      auto it = tracks_.find(name);
      if (it != tracks_.end() && it->second.negotiating) {
        push(Rec{'E', it->second.neg_tid, -1, {}, name, args, ts});
        it->second.negotiating = false;
      }
      const bool opens = e.ok && has_op_phase(e.kind) && runs(name);
      if (!opens) {
        if (it != tracks_.end() && it->second.op == Phase::kNone) tracks_.erase(it);
        continue;
      }
      Track& t = tracks_[name];
      if (t.op != Phase::kNone) continue;  // the previous one still runs (device work): not recorded
      push(Rec{'B', 0, -1, upper(op_kind_name(e.kind)), name, {}, ts});
      push(Rec{'B', 0, -1, "QUEUE", name, {}, ts});
      t.op = Phase::kActivity;
    }
  }
}

void Timeline::activity(const PlanEntry& e, const char* what) {
  std::lock_guard<std::mutex> g(mu_);
  if (!on()) return;
  const int64_t ts = now_us();
  for (const std::string& name : e.names) {
    auto it = tracks_.find(name);
    if (it == tracks_.end() || it->second.op == Phase::kNone) continue;
    end_activity(name, it->second, ts);
    if (what) {
      push(Rec{'B', 0, -1, what, name, {}, ts});
      it->second.op = Phase::kActivity;
    }
  }
}

void Timeline::launched(const PlanEntry& e, const Backend& b) {
  if (b.notes_activities()) return activity(e, nullptr);
  activity(e, (upper(b.name()) + "_" + upper(op_kind_name(e.kind))).c_str());
}

void Timeline::done(const std::string& name, const Signature& sig) {
  std::lock_guard<std::mutex> g(mu_);
  if (!on()) return;
  auto it = tracks_.find(name);
  if (it == tracks_.end() || it->second.op == Phase::kNone) return;
  const int64_t ts = now_us();
  end_activity(name, it->second, ts);
  std::string args = "\"dtype\": \"" + std::string(dtype_name(sig.dtype)) + "\", \"shape\": \"" + shape_str(sig.shape) + "\"";
  push(Rec{'E', 0, -1, {}, name, std::move(args), ts});
  it->second.op = Phase::kNone;
  if (!it->second.negotiating) tracks_.erase(it);
}

void Timeline::cycle() {
  std::lock_guard<std::mutex> g(mu_);
  if (!on() || !mark_cycles_) return;
  push(Rec{'i', 0, -1, "CYCLE_START", {}, {}, now_us()});
}

void Timeline::writer_loop(std::FILE* f, int64_t epoch_us) {
  std::unordered_map<std::string, int> pids;  // tensor name -> its "process"
  std::vector<int> depth(2, 0);               // open B events per (pid, tid): index pid * 2 + tid
  std::string out;
  int64_t last_ts = 0;
  bool failed = false;
  auto line = [&](const std::string& text) {
    out += ",\n";
    out += text;
  };
  out = "[\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": {\"name\": \"appliance timeline (rank 0)\", "
        "\"start_time_since_epoch_in_micros\": " + std::to_string(epoch_us) + "}}";
  line("{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": 0, \"args\": {\"sort_index\": 0}}");
  auto pid_of = [&](const std::string& tensor) {
    auto it = pids.find(tensor);
    if (it != pids.end()) return it->second;
    const int pid = static_cast<int>(pids.size()) + 1;
    pids.emplace(tensor, pid);
    depth.resize(static_cast<size_t>(pid + 1) * 2, 0);
    std::string meta = "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(pid) + ", \"args\": {\"name\": ";
    append_json_string(meta, tensor);
    line(meta + "}}");
    line("{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": " + std::to_string(pid) +
         ", \"args\": {\"sort_index\": " + std::to_string(pid) + "}}");
    return pid;
  };
  auto flush = [&]() {
    if (!failed && !out.empty() && (std::fwrite(out.data(), 1, out.size(), f) != out.size() || std::fflush(f) != 0)) {
      failed = true;
      on_.store(false);  // stop recording; the engine goes on
      log_line(rank_, "timeline: cannot write " + path() + " (" + std::strerror(errno) + "); recording stopped");
    }
    out.clear();
  };
  std::deque<Rec> batch;
  for (bool last = false; !last;) {
    {
      std::unique_lock<std::mutex> g(mu_);
      // No notification per record (it would cost the engine a wake-up): look every 20 ms.
      cv_.wait_for(g, std::chrono::milliseconds(20), [&] { return closing_; });
      batch.swap(queue_);
      last = closing_;
    }
    for (const Rec& r : batch) {
      last_ts = r.ts;
      if (r.ph == 'i') {
        line("{\"ph\": \"i\", \"name\": \"" + r.what + "\", \"ts\": " + std::to_string(r.ts) + ", \"s\": \"g\", \"pid\": 0, \"tid\": 0}");
        continue;
      }
      const int pid = pid_of(r.tensor);
      int& d = depth[static_cast<size_t>(pid) * 2 + r.tid];
      std::string head = "{\"ph\": \"" + std::string(1, r.ph) + "\"";
      std::string where = ", \"ts\": " + std::to_string(r.ts) + ", \"pid\": " + std::to_string(pid) + ", \"tid\": " + std::to_string(r.tid);
      if (r.ph == 'B') {
        ++d;
        line(head + ", \"name\": \"" + r.what + "\"" + where + "}");
      } else if (r.ph == 'X') {
        line(head + ", \"name\": \"" + std::to_string(r.mark) + "\"" + where + ", \"dur\": 0}");
      } else if (d > 0) {  // 'E': never one without its B (a B may have been dropped)
        --d;
        line(head + where + (r.args.empty() ? "" : ", \"args\": {" + r.args + "}") + "}");
      }
    }
    batch.clear();
    flush();  // at most every 20 ms: the file can be watched while it grows
  }
  for (auto& kv : pids)
    for (int tid = 0; tid < 2; ++tid)
      for (int& d = depth[static_cast<size_t>(kv.second) * 2 + tid]; d > 0; --d)
        line("{\"ph\": \"E\", \"ts\": " + std::to_string(last_ts) + ", \"pid\": " + std::to_string(kv.second) +
             ", \"tid\": " + std::to_string(tid) + "}");
  uint64_t dropped;
  {
    std::lock_guard<std::mutex> g(mu_);
    dropped = dropped_;
  }
  if (dropped)
    line("{\"name\": \"dropped_events\", \"ph\": \"M\", \"pid\": 0, \"args\": {\"dropped\": " + std::to_string(dropped) + "}}");
  out += "\n]\n";
  flush();
  if (std::fclose(f) != 0 && !failed) log_line(rank_, "timeline: cannot close " + path() + " (" + std::strerror(errno) + ")");
}

}  // namespace appliance
