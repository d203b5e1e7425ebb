// Timeline recorder and writer (see timeline.h for the file layout).
#include "engine/timeline.h"

#include <cctype>
#include <charconv>
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

const char* negotiate_name(OpKind k) {
  switch (k) {
    case OpKind::kAllreduce: return "NEGOTIATE_ALLREDUCE";
    case OpKind::kAllgather: return "NEGOTIATE_ALLGATHER";
    case OpKind::kBroadcast: return "NEGOTIATE_BROADCAST";
    case OpKind::kAlltoall: return "NEGOTIATE_ALLTOALL";
    case OpKind::kReducescatter: return "NEGOTIATE_REDUCESCATTER";
    case OpKind::kBarrier: return "NEGOTIATE_BARRIER";
    case OpKind::kJoin: return "NEGOTIATE_JOIN";
  }
  return "NEGOTIATE";
}

const char* op_phase_name(OpKind k) {  // nullptr: no operation phase (as Horovod: barrier, join)
  switch (k) {
    case OpKind::kAllreduce: return "ALLREDUCE";
    case OpKind::kAllgather: return "ALLGATHER";
    case OpKind::kBroadcast: return "BROADCAST";
    case OpKind::kAlltoall: return "ALLTOALL";
    case OpKind::kReducescatter: return "REDUCESCATTER";
    default: return nullptr;
  }
}
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
        end_activity(t, ts);
        push('E', 0, t.pid, nullptr, ts, -1, "\"stopped\": true");
      }
      if (t.negotiating) push('E', t.neg_tid, t.pid, nullptr, ts, -1, "\"stopped\": true");
    }
    tracks_.clear();
    closing_ = true;
  }
  cv_.notify_all();
  writer_.join();
  std::lock_guard<std::mutex> g(mu_);
  path_.clear();
}

void Timeline::push(char ph, int tid, int pid, const char* what, int64_t ts, int mark, std::string args) {
  if (queue_.size() >= kQueueLimit) {
    ++dropped_;
    return;
  }
  queue_.push_back(Rec{ph, static_cast<uint8_t>(tid), pid, mark, what, ts, std::move(args)});
}

Timeline::Track& Timeline::track(const std::string& name) {
  auto it = tracks_.find(name);
  if (it != tracks_.end()) return it->second;
  Track& t = tracks_[name];
  t.pid = static_cast<int>(tracks_.size());  // 1, 2, ...: pid 0 is the timeline itself
  push('M', 0, t.pid, nullptr, 0, -1, name);
  return t;
}

const char* Timeline::intern(std::string s) { return interned_.insert(std::move(s)).first->c_str(); }

void Timeline::end_activity(Track& t, int64_t ts) {
  if (t.op != Phase::kActivity) return;
  push('E', 0, t.pid, nullptr, ts);
  t.op = Phase::kOp;
}

void Timeline::negotiate(const std::string& name, OpKind kind, int rank) {
  std::lock_guard<std::mutex> g(mu_);
  if (!on()) return;
  const int64_t ts = now_us();
  Track& t = track(name);
  if (!t.negotiating) {
    t.negotiating = true;
    t.neg_tid = t.op == Phase::kNone ? 0 : 1;  // the previous operation of this name still runs
    push('B', t.neg_tid, t.pid, negotiate_name(kind), ts);
  }
  push('X', t.neg_tid, t.pid, nullptr, ts, rank);
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
    const char* kind = op_phase_name(e.kind);
    for (const std::string& name : e.names) {
      Track& t = track(name);
      if (t.negotiating) {
        push('E', t.neg_tid, t.pid, nullptr, ts, -1, args);
        t.negotiating = false;
      }
      // Not while the previous operation of this name still runs (device work): not recorded.
      if (!e.ok || !kind || t.op != Phase::kNone || !runs(name)) continue;
      push('B', 0, t.pid, kind, ts);
      push('B', 0, t.pid, "QUEUE", ts);
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
    end_activity(it->second, ts);
    if (what) {
      push('B', 0, it->second.pid, what, ts);
      it->second.op = Phase::kActivity;
    }
  }
}

void Timeline::launched(const PlanEntry& e, const Backend& b) {
  if (b.notes_activities()) return activity(e, nullptr);
  const char* what;
  {
    std::lock_guard<std::mutex> g(mu_);
    what = intern(upper(b.name()) + "_" + upper(op_kind_name(e.kind)));
  }
  activity(e, what);
}

void Timeline::done(const std::string& name, const Signature& sig) {
  std::lock_guard<std::mutex> g(mu_);
  if (!on()) return;
  auto it = tracks_.find(name);
  if (it == tracks_.end() || it->second.op == Phase::kNone) return;
  Track& t = it->second;
  const int64_t ts = now_us();
  end_activity(t, ts);
  push('E', 0, t.pid, nullptr, ts, -1,
       "\"dtype\": \"" + std::string(dtype_name(sig.dtype)) + "\", \"shape\": \"" + shape_str(sig.shape) + "\"");
  t.op = Phase::kNone;
}

void Timeline::cycle() {
  std::lock_guard<std::mutex> g(mu_);
  if (!on() || !mark_cycles_) return;
  push('i', 0, 0, "CYCLE_START", now_us());
}

namespace {
void append_int(std::string& out, int64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}
}  // namespace

void Timeline::writer_loop(std::FILE* f, int64_t epoch_us) {
  std::vector<int> depth(2, 0);  // open B events per (pid, tid): index pid * 2 + tid
  std::string out;
  out.reserve(1 << 16);
  int64_t last_ts = 0;
  bool failed = false;
  auto event = [&](char ph, int pid, int tid, int64_t ts) {  // opens {"ph": .., "ts": .., "pid": .., "tid": ..
    out += ",\n{\"ph\": \"";
    out += ph;
    out += "\", \"ts\": ";
    append_int(out, ts);
    out += ", \"pid\": ";
    append_int(out, pid);
    out += ", \"tid\": ";
    append_int(out, tid);
  };
  auto meta = [&](int pid, const char* key, const std::string& json_value) {
    out += ",\n{\"name\": \"";
    out += key;
    out += "\", \"ph\": \"M\", \"pid\": ";
    append_int(out, pid);
    out += ", \"args\": {";
    out += json_value;
    out += "}}";
  };
  auto flush = [&]() {
    if (!failed && !out.empty() && (std::fwrite(out.data(), 1, out.size(), f) != out.size() || std::fflush(f) != 0)) {
      failed = true;
      on_.store(false);  // stop recording; the engine goes on
      log_line(rank_, "timeline: cannot write " + path() + " (" + std::strerror(errno) + "); recording stopped");
    }
    out.clear();
  };
  out = "[\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": {\"name\": \"appliance timeline (rank 0)\", "
        "\"start_time_since_epoch_in_micros\": " + std::to_string(epoch_us) + "}}";
  meta(0, "process_sort_index", "\"sort_index\": 0");
  std::vector<Rec> batch;
  for (bool last = false; !last;) {
    {
      std::unique_lock<std::mutex> g(mu_);
      // No notification per record (it would cost the engine a wake-up): look every 20 ms.
      cv_.wait_for(g, std::chrono::milliseconds(20), [&] { return closing_; });
      batch.swap(queue_);
      last = closing_;
    }
    for (const Rec& r : batch) {
      if (r.ph == 'M') {
        std::string name = "\"name\": ";
        append_json_string(name, r.args);
        meta(r.pid, "process_name", name);
        meta(r.pid, "process_sort_index", "\"sort_index\": " + std::to_string(r.pid));
        depth.resize(static_cast<size_t>(r.pid + 1) * 2, 0);
        continue;
      }
      last_ts = r.ts;
      if (r.ph == 'i') {
        event('i', 0, 0, r.ts);
        out += ", \"name\": \"";
        out += r.what;
        out += "\", \"s\": \"g\"}";
        continue;
      }
      const size_t at = static_cast<size_t>(r.pid) * 2 + r.tid;
      if (at >= depth.size()) depth.resize(at + 2, 0);  // its M record was dropped
      int& d = depth[at];
      if (r.ph == 'E' && d == 0) continue;  // never an E without its B (a B may have been dropped)
      event(r.ph, r.pid, r.tid, r.ts);
      if (r.ph == 'B') {
        ++d;
        out += ", \"name\": \"";
        out += r.what;
        out += "\"}";
      } else if (r.ph == 'X') {
        out += ", \"name\": \"";
        append_int(out, r.mark);
        out += "\", \"dur\": 0}";
      } else {
        --d;
        if (!r.args.empty()) {
          out += ", \"args\": {";
          out += r.args;
          out += "}";
        }
        out += "}";
      }
    }
    batch.clear();
    flush();  // at most every 20 ms: the file can be watched while it grows
  }
  for (size_t i = 2; i < depth.size(); ++i)
    for (; depth[i] > 0; --depth[i]) {
      event('E', static_cast<int>(i / 2), static_cast<int>(i % 2), last_ts);
      out += "}";
    }
  uint64_t dropped;
  {
    std::lock_guard<std::mutex> g(mu_);
    dropped = dropped_;
  }
  if (dropped) meta(0, "dropped_events", "\"dropped\": " + std::to_string(dropped));
  out += "\n]\n";
  flush();
  if (std::fclose(f) != 0 && !failed) log_line(rank_, "timeline: cannot close " + path() + " (" + std::strerror(errno) + ")");
}

}  // namespace appliance
