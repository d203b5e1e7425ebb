// build_mesh: every link at once, over Links (see mesh.h).
#include "bootstrap/mesh.h"

#include "transport/auth.h"

namespace appliance {

Mesh build_mesh(Store& store, const MeshOptions& opts) {
  Links links(store, opts);
  const Deadline d = deadline_after_ms(opts.timeout_ms);
  const int me = opts.rank, n = opts.size;
  Mesh mesh;
  mesh.peers = links.peers();
  mesh.topo = links.topology();
  mesh.data.resize(n);
  mesh.control.resize(me == 0 ? n : 1);
  // What this rank connects first (the other side's acceptor thread answers without waiting
  // on anyone), then what its peers connect.
  if (me != 0 && n > 1) mesh.control[0] = links.open(0, kControlChannel, d);
  for (int r = me + 1; r < n; ++r) mesh.data[r] = links.open(r, kDataChannel, d);
  for (int r = 0; r < me; ++r) mesh.data[r] = links.open(r, kDataChannel, d);
  if (me == 0)
    for (int r = 1; r < n; ++r) mesh.control[r] = links.open(r, kControlChannel, d);
  return mesh;
}

}  // namespace appliance
