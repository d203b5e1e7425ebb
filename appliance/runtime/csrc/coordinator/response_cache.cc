// ResponseCache: ids of repeated (name, signature) pairs, least recently used evicted first
// (see response_cache.h).
#include "coordinator/response_cache.h"

namespace appliance {

uint32_t ResponseCache::lookup(const std::string& name, const Signature& sig) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end() || it->second->sig != sig) return 0;
  return it->second->id;
}

const ResponseCache::Entry* ResponseCache::get(uint32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &*it->second;
}

uint32_t ResponseCache::id_of(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? 0 : it->second->id;
}

void ResponseCache::erase(uint32_t id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  by_name_.erase(it->second->name);
  lru_.erase(it->second);
  by_id_.erase(it);
}

uint32_t ResponseCache::put(const std::string& name, const Signature& sig) {
  if (!enabled() || !sig.cacheable()) return 0;
  auto it = by_name_.find(name);
  if (it != by_name_.end()) {
    if (it->second->sig == sig) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->id;
    }
    by_id_.erase(it->second->id);
    lru_.erase(it->second);
    by_name_.erase(it);
  }
  lru_.push_front(Entry{next_id_++, name, sig});
  by_name_[name] = lru_.begin();
  by_id_[lru_.front().id] = lru_.begin();
  while (lru_.size() > capacity_) {
    const Entry& victim = lru_.back();
    by_name_.erase(victim.name);
    by_id_.erase(victim.id);
    lru_.pop_back();
  }
  return lru_.front().id;
}

}  // namespace appliance
