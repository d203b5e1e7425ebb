// Shared-memory pairing: turns the authenticated TCP connection of a same-host rank pair into
// a ShmLink, or says why it cannot (then the pair stays on TCP). Used by bootstrap/transports only.
//
// Three phases, run by every rank in this order so no rank waits on one that is itself
// waiting: (1) the lower rank of each pair creates the segment and sends its name (or the
// reason it could not) over the socket; (2) the higher rank receives the name, maps the
// segment, unlinks the name and answers yes (or no, with the reason); (3) the lower rank
// reads the answer and unlinks the name too. Phase 1 never blocks on a peer, phase 2 only
// on phase-1 messages, phase 3 only on phase-2 answers. Frames: kControl, seq 0, on the raw
// fd (the Channel built afterwards starts its own count).
// Failure modes: a setup that cannot complete on this machine (no /dev/shm, full, a peer
// that cannot see our object) is not an error: the pair falls back to TCP and the caller
// prints one line. A peer that dies or times out during the exchange throws as any
// handshake does (kPeerLost / kTimeout naming it).
#pragma once

#include <memory>
#include <string>

#include "transport/channel.h"
#include "transport/shm/shm_segment.h"

namespace appliance {

struct ShmOffer {
  int peer = -1;
  int fd = -1;
  std::shared_ptr<ShmSegment> seg;  // null when creation failed
  std::string name;
  std::string why;                  // set when this pair stays on TCP
};

// Phase 1 (lower rank).
ShmOffer shm_offer(int fd, int me, int peer, uint64_t ring_bytes, Deadline d, const std::string& who);
// Phase 2 (higher rank): the mapped segment, or null with *why set.
std::shared_ptr<ShmSegment> shm_accept(int fd, Deadline d, const std::string& who, std::string* why);
// Phase 3 (lower rank): true when the peer mapped the segment; else o.why says why not.
bool shm_confirm(ShmOffer& o, Deadline d, const std::string& who);

}  // namespace appliance
