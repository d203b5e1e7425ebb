// What every backend computes alike from a plan entry: reducescatter's rows and alltoall's
// layout (see backend.h).
#include "backends/backend.h"

namespace appliance {

int64_t reducescatter_rows(int64_t dim0, int size, int rank) {
  return dim0 / size + (rank < dim0 % size ? 1 : 0);
}

AlltoallLayout alltoall_layout(const PlanEntry& e, const std::vector<int64_t>& in_shape, int size, int rank) {
  const Signature& s = e.sigs[0];
  const size_t row_bytes = static_cast<size_t>(s.row_elems()) * dtype_size(s.dtype);
  AlltoallLayout l;
  l.send.resize(size);
  l.recv.resize(size);
  l.recv_splits.assign(size, 0);
  int64_t rows = 0;
  for (int p = 0; p < size; ++p) {
    l.send[p] = static_cast<size_t>(e.sizes[static_cast<size_t>(rank) * size + p]) * row_bytes;
    const int64_t in_rows = e.sizes[static_cast<size_t>(p) * size + rank];
    l.recv_splits[p] = in_rows;
    l.recv[p] = static_cast<size_t>(in_rows) * row_bytes;
    rows += in_rows;
    l.recv_total += l.recv[p];
  }
  l.out_shape = in_shape;
  l.out_shape[0] = rows;
  return l;
}

}  // namespace appliance
