// ResponseCache: gives each repeated (name, signature) a small id, so that in steady state a
// rank's readiness and the coordinator's plan travel as ids instead of full requests.
//
// Every rank holds one and updates it identically: put() is called for every successful plan
// entry, in plan order, by every rank (rank 0's coordinator shares rank 0's cache). Ids are
// never reused, so an id a lagging rank sends either still means the same (name, signature)
// or is unknown (evicted), in which case the coordinator asks that rank to resend in full.
// Eviction is least-recently-used, deterministic given the same sequence of puts.
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>

#include "coordinator/request.h"

namespace appliance {

class ResponseCache {
 public:
  struct Entry {
    uint32_t id;
    std::string name;
    Signature sig;
  };

  explicit ResponseCache(size_t capacity) : capacity_(capacity) {}

  bool enabled() const { return capacity_ > 0; }
  // Id of (name, sig) if cached with exactly this signature, else 0.
  uint32_t lookup(const std::string& name, const Signature& sig) const;
  // The entry with this id, or nullptr when evicted/unknown.
  const Entry* get(uint32_t id) const;
  // The id `name` is cached under (whatever its signature), or 0.
  uint32_t id_of(const std::string& name) const;
  // Forgets the entry with this id (no-op when unknown); its id is never given again.
  void erase(uint32_t id);
  // Insert or refresh (name, sig); a different signature for a known name replaces it under a
  // new id. Returns the id (0 when disabled or not cacheable).
  uint32_t put(const std::string& name, const Signature& sig);
  size_t size() const { return lru_.size(); }

 private:
  size_t capacity_;
  uint32_t next_id_ = 1;
  std::list<Entry> lru_;  // front = most recent
  std::unordered_map<std::string, std::list<Entry>::iterator> by_name_;
  std::unordered_map<uint32_t, std::list<Entry>::iterator> by_id_;
};

}  // namespace appliance
