// The bytes of the control messages between every rank's engine and rank 0's coordinator
// (see messages.h).
#include "engine/messages.h"

#include <algorithm>

namespace appliance {

namespace {
constexpr uint32_t kMaxItems = 1u << 20;

void put_ids(Writer& w, const std::vector<uint32_t>& ids) {
  w.u32(static_cast<uint32_t>(ids.size()));
  for (uint32_t id : ids) w.u32(id);
}

std::vector<uint32_t> get_ids(Reader& r) {
  uint32_t n = r.u32();
  if (n > kMaxItems || n > r.remaining() / 4) r.fail("id list of " + std::to_string(n) + " items");
  std::vector<uint32_t> ids(n);
  for (auto& id : ids) id = r.u32();
  return ids;
}

void expect_type(Reader& r, CtrlType t) {
  if (r.u8() != static_cast<uint8_t>(t)) r.fail("unexpected control message type");
}
}  // namespace

CtrlType peek_ctrl_type(const std::vector<uint8_t>& p, const std::string& from) {
  Reader r(p.data(), p.size(), "control message from " + from);
  uint8_t t = r.u8();
  if (t < 1 || t > static_cast<uint8_t>(CtrlType::kGone)) r.fail("unknown control message type " + std::to_string(t));
  return static_cast<CtrlType>(t);
}

std::vector<uint8_t> encode_ready(const ReadyMsg& m) {
  Writer w;
  w.u8(static_cast<uint8_t>(CtrlType::kReady));
  w.u64(m.epoch);
  w.u32(static_cast<uint32_t>(m.full.size()));
  for (auto& q : m.full) q.encode(w);
  put_ids(w, m.ids);
  w.i64(m.waiting_ms);
  return w.take();
}

ReadyMsg decode_ready(const std::vector<uint8_t>& p, const std::string& from) {
  Reader r(p.data(), p.size(), "READY message from " + from);
  expect_type(r, CtrlType::kReady);
  ReadyMsg m;
  m.epoch = r.u64();
  uint32_t n = r.u32();
  if (n > kMaxItems) r.fail(std::to_string(n) + " requests");
  for (uint32_t i = 0; i < n; ++i) m.full.push_back(Request::decode(r));
  m.ids = get_ids(r);
  m.waiting_ms = r.i64();
  if (m.waiting_ms < ReadyMsg::kNoNews) r.fail("waited " + std::to_string(m.waiting_ms) + " ms");
  r.expect_done();
  return m;
}

std::vector<uint8_t> encode_plan(const Plan& p, const ResponseCache& cache) {
  Writer w;
  encode_plan_into(w, p, cache);
  return w.take();
}

void encode_plan_into(Writer& w, const Plan& p, const ResponseCache& cache) {
  w.u8(static_cast<uint8_t>(CtrlType::kPlan));
  w.u64(p.seq);
  w.u32(static_cast<uint32_t>(p.entries.size()));
  for (const PlanEntry& e : p.entries) {
    std::vector<uint32_t> ids;
    bool by_ids = e.ok && e.sizes.empty() && e.joined.empty() && cache.enabled();
    for (size_t i = 0; by_ids && i < e.names.size(); ++i) {
      uint32_t id = cache.lookup(e.names[i], e.sigs[i]);
      if (id == 0) by_ids = false;
      ids.push_back(id);
    }
    const bool result = e.ok && !e.result.empty() && e.names.size() == 1;
    w.u8(static_cast<uint8_t>((e.ok ? 1 : 0) | (by_ids ? 2 : 0) | (result ? 4 : 0)));
    if (result) w.bytes(e.result.data(), e.result.size());
    if (by_ids) {
      put_ids(w, ids);
      continue;
    }
    w.u8(static_cast<uint8_t>(e.kind));
    w.u32(static_cast<uint32_t>(e.names.size()));
    for (size_t i = 0; i < e.names.size(); ++i) {
      w.str(e.names[i]);
      e.sigs[i].encode(w);
    }
    w.u8(static_cast<uint8_t>(e.error_code));
    w.str(e.error);
    w.i64s(e.sizes);
    w.i32(e.joined_last);
    w.bytes(e.joined.data(), e.joined.size());
  }
  w.u32(static_cast<uint32_t>(p.late.size()));
  for (const Late& l : p.late) {
    w.i32(l.rank);
    w.u32(l.us);
  }
}

Plan decode_plan(const std::vector<uint8_t>& payload, const ResponseCache& cache, int size, const std::string& from,
                 const std::function<int(int32_t)>& set_size) {
  return decode_plan(payload.data(), payload.size(), cache, size, from, set_size);
}

Plan decode_plan(const uint8_t* payload, size_t bytes, const ResponseCache& cache, int size, const std::string& from,
                 const std::function<int(int32_t)>& set_size) {
  Reader r(payload, bytes, "PLAN message from " + from);
  expect_type(r, CtrlType::kPlan);
  Plan p;
  p.seq = r.u64();
  uint32_t n = r.u32();
  if (n > kMaxItems) r.fail(std::to_string(n) + " entries");
  for (uint32_t k = 0; k < n; ++k) {
    PlanEntry e;
    uint8_t flags = r.u8();
    if (flags > 7 || ((flags & 4) && !(flags & 1))) r.fail("bad entry flags");
    e.ok = flags & 1;
    if (flags & 4) {
      e.result = r.bytes(256u << 20);
      if (e.result.empty()) r.fail("empty carried result");
    }
    auto check_result = [&] {
      if (!e.result.empty() && (e.names.size() != 1 || e.kind != OpKind::kAllreduce || e.result.size() != e.sigs[0].nbytes()))
        r.fail("carried result of " + std::to_string(e.result.size()) + " bytes for an entry that is not one allreduce of as many");
    };
    if (flags & 2) {
      for (uint32_t id : get_ids(r)) {
        const ResponseCache::Entry* c = cache.get(id);
        if (!c) r.fail("plan refers to response cache id " + std::to_string(id) + " which this rank does not hold");
        e.kind = c->sig.kind;
        e.names.push_back(c->name);
        e.sigs.push_back(c->sig);
      }
      if (e.names.empty()) r.fail("empty cached entry");
      check_result();
      p.entries.push_back(std::move(e));
      continue;
    }
    uint8_t kind = r.u8();
    if (!op_kind_valid(kind)) r.fail("unknown operation kind " + std::to_string(kind));
    e.kind = static_cast<OpKind>(kind);
    uint32_t names = r.u32();
    if (names == 0 || names > kMaxItems) r.fail(std::to_string(names) + " names in one entry");
    for (uint32_t i = 0; i < names; ++i) {
      e.names.push_back(r.str(1 << 16));
      e.sigs.push_back(Signature::decode(r));
    }
    uint8_t code = r.u8();
    if (code > static_cast<uint8_t>(Code::kStalled)) r.fail("unknown error code " + std::to_string(code));
    e.error_code = static_cast<Code>(code);
    e.error = r.str(1 << 16);
    e.sizes = r.i64s(static_cast<size_t>(size) * size);
    e.joined_last = r.i32();
    auto joined = r.bytes(static_cast<size_t>(size));
    e.joined.assign(joined.begin(), joined.end());
    // Sizes speak of the entry's process set (all ranks for set 0).
    const int32_t set = e.sigs[0].process_set;
    const int P = set == 0 ? size : (set_size ? set_size(set) : -1);
    if (e.ok && set != 0 && P <= 0) r.fail("entry for process set " + std::to_string(set) + ", which this rank does not know");
    if (e.kind == OpKind::kAllgather && e.ok && e.sizes.size() != static_cast<size_t>(P))
      r.fail("allgather entry without one size per rank");
    if (e.kind == OpKind::kAlltoall && e.ok && e.sizes.size() != static_cast<size_t>(P) * P)
      r.fail("alltoall entry without a full split matrix");
    if (!e.joined.empty() && e.joined.size() != static_cast<size_t>(size)) r.fail("joined vector of wrong length");
    check_result();
    p.entries.push_back(std::move(e));
  }
  const uint32_t late = r.u32();
  if (late > static_cast<uint32_t>(size) * 64u) r.fail(std::to_string(late) + " lateness rows");
  for (uint32_t k = 0; k < late; ++k) {
    Late l;
    l.rank = r.i32();
    l.us = r.u32();
    if (l.rank < 0 || l.rank >= size) r.fail("lateness of rank " + std::to_string(l.rank));
    p.late.push_back(l);
  }
  r.expect_done();
  return p;
}

std::vector<uint8_t> encode_resend(const std::vector<uint32_t>& ids) {
  Writer w;
  w.u8(static_cast<uint8_t>(CtrlType::kResend));
  put_ids(w, ids);
  return w.take();
}

std::vector<uint32_t> decode_resend(const std::vector<uint8_t>& p, const std::string& from) {
  Reader r(p.data(), p.size(), "RESEND message from " + from);
  expect_type(r, CtrlType::kResend);
  auto ids = get_ids(r);
  r.expect_done();
  return ids;
}

std::vector<uint8_t> encode_bye() { return {static_cast<uint8_t>(CtrlType::kBye)}; }

namespace {
constexpr uint32_t kMaxNoticeLines = 256;
constexpr size_t kMaxNoticeLine = 4096;
}  // namespace

std::vector<uint8_t> encode_notice(const std::vector<std::string>& lines) {
  Writer w;
  w.u8(static_cast<uint8_t>(CtrlType::kNotice));
  const uint32_t n = static_cast<uint32_t>(std::min<size_t>(lines.size(), kMaxNoticeLines));
  w.u32(n);
  for (uint32_t i = 0; i < n; ++i) w.str(lines[i].substr(0, kMaxNoticeLine));
  return w.take();
}

std::vector<std::string> decode_notice(const std::vector<uint8_t>& p, const std::string& from) {
  Reader r(p.data(), p.size(), "NOTICE message from " + from);
  expect_type(r, CtrlType::kNotice);
  uint32_t n = r.u32();
  if (n > kMaxNoticeLines) r.fail(std::to_string(n) + " lines");
  std::vector<std::string> lines;
  for (uint32_t i = 0; i < n; ++i) lines.push_back(r.str(kMaxNoticeLine));
  r.expect_done();
  return lines;
}

std::vector<uint8_t> encode_up(const UpMsg& m) {
  Writer w;
  w.u8(static_cast<uint8_t>(CtrlType::kUp));
  w.u64(m.seq);
  put_ids(w, m.ids);
  w.u32(static_cast<uint32_t>(m.full.size()));
  for (const UpMsg::Full& f : m.full) {
    w.i32(f.rank);
    f.req.encode(w);
    w.i64(f.waited_ms);
  }
  w.u32(static_cast<uint32_t>(m.left.size()));
  for (int32_t r : m.left) w.i32(r);
  put_ids(w, m.stale);
  w.u32(static_cast<uint32_t>(m.ids.size()));  // one row per id (none known: nobody waited)
  for (size_t i = 0; i < m.ids.size(); ++i) {
    const Late l = i < m.late.size() ? m.late[i] : Late{0, UINT32_MAX};
    w.i32(l.rank);
    w.u32(l.us);
  }
  w.u32(static_cast<uint32_t>(m.ids.size()));  // one carried input per id (none: empty)
  for (size_t i = 0; i < m.ids.size(); ++i) {
    if (i < m.carried.size()) w.bytes(m.carried[i].data(), m.carried[i].size());
    else w.u32(0);
  }
  w.u32(static_cast<uint32_t>(m.waiting.size()));
  for (const UpMsg::Waiting& x : m.waiting) {
    w.i32(x.rank);
    w.i64(x.ms);
    w.u32(static_cast<uint32_t>(x.also.size()));
    for (const Request& q : x.also) q.encode(w);
  }
  return w.take();
}

UpMsg decode_up(const std::vector<uint8_t>& p, int size, const std::string& from) {
  Reader r(p.data(), p.size(), "UP message from " + from);
  expect_type(r, CtrlType::kUp);
  UpMsg m;
  m.seq = r.u64();
  m.ids = get_ids(r);
  uint32_t n = r.u32();
  if (n > kMaxItems) r.fail(std::to_string(n) + " requests");
  for (uint32_t i = 0; i < n; ++i) {
    UpMsg::Full f;
    f.rank = r.i32();
    if (f.rank < 0 || f.rank >= size) r.fail("request of rank " + std::to_string(f.rank));
    f.req = Request::decode(r);
    f.waited_ms = r.i64();
    if (f.waited_ms < 0) r.fail("negative wait");
    m.full.push_back(std::move(f));
  }
  n = r.u32();
  if (n > static_cast<uint32_t>(size)) r.fail(std::to_string(n) + " ranks left");
  for (uint32_t i = 0; i < n; ++i) {
    int32_t x = r.i32();
    if (x < 0 || x >= size) r.fail("rank " + std::to_string(x) + " left");
    m.left.push_back(x);
  }
  m.stale = get_ids(r);
  n = r.u32();
  if (n != m.ids.size()) r.fail(std::to_string(n) + " lateness rows for " + std::to_string(m.ids.size()) + " ids");
  for (uint32_t i = 0; i < n; ++i) {
    Late l;
    l.rank = r.i32();
    l.us = r.u32();
    if (l.rank < 0 || l.rank >= size) r.fail("lateness of rank " + std::to_string(l.rank));
    m.late.push_back(l);
  }
  n = r.u32();
  if (n != m.ids.size()) r.fail(std::to_string(n) + " carried inputs for " + std::to_string(m.ids.size()) + " ids");
  m.carried.resize(n);
  for (uint32_t i = 0; i < n; ++i) m.carried[i] = r.bytes(256u << 20);
  n = r.u32();
  if (n > static_cast<uint32_t>(size)) r.fail(std::to_string(n) + " waiting ranks");
  for (uint32_t i = 0; i < n; ++i) {
    UpMsg::Waiting x;
    x.rank = r.i32();
    if (x.rank < 0 || x.rank >= size) r.fail("waiting rank " + std::to_string(x.rank));
    x.ms = r.i64();
    if (x.ms < ReadyMsg::kNotWaiting) r.fail("waited " + std::to_string(x.ms) + " ms");
    const uint32_t k = r.u32();
    if (k > kMaxItems) r.fail(std::to_string(k) + " requests of a waiting rank");
    for (uint32_t j = 0; j < k; ++j) x.also.push_back(Request::decode(r));
    m.waiting.push_back(std::move(x));
  }
  r.expect_done();
  return m;
}

std::vector<uint8_t> encode_down(const DownMsg& m, const Plan* plan, const ResponseCache* cache) {
  Writer w;
  w.u8(static_cast<uint8_t>(CtrlType::kDown));
  w.u64(m.seq);
  w.u8(m.slow ? 1 : 0);
  put_ids(w, m.evict);
  const uint32_t n = static_cast<uint32_t>(std::min<size_t>(m.lines.size(), kMaxNoticeLines));
  w.u32(n);
  for (uint32_t i = 0; i < n; ++i) w.str(m.lines[i].substr(0, kMaxNoticeLine));
  const size_t at = w.size();
  w.u32(0);  // the plan's length, once it is written
  if (plan && !plan->entries.empty()) {
    encode_plan_into(w, *plan, *cache);
    w.patch_u32(at, static_cast<uint32_t>(w.size() - at - 4));
  }
  return w.take();
}

DownMsg decode_down(const std::vector<uint8_t>& p, const std::string& from) {
  Reader r(p.data(), p.size(), "DOWN message from " + from);
  expect_type(r, CtrlType::kDown);
  DownMsg m;
  m.seq = r.u64();
  const uint8_t flags = r.u8();
  if (flags > 1) r.fail("bad flags");
  m.slow = flags & 1;
  m.evict = get_ids(r);
  uint32_t n = r.u32();
  if (n > kMaxNoticeLines) r.fail(std::to_string(n) + " lines");
  for (uint32_t i = 0; i < n; ++i) m.lines.push_back(r.str(kMaxNoticeLine));
  m.plan = r.bytes_view(256u << 20, &m.plan_bytes);
  r.expect_done();
  return m;
}

std::vector<uint8_t> encode_gone(int32_t rank) {
  Writer w;
  w.u8(static_cast<uint8_t>(CtrlType::kGone));
  w.i32(rank);
  return w.take();
}

int32_t decode_gone(const std::vector<uint8_t>& p, int size, const std::string& from) {
  Reader r(p.data(), p.size(), "GONE message from " + from);
  expect_type(r, CtrlType::kGone);
  int32_t x = r.i32();
  if (x < 0 || x >= size) r.fail("rank " + std::to_string(x));
  r.expect_done();
  return x;
}

}  // namespace appliance
