#pragma once
// What the state agreement of an elastic generation sends (generation.cpp): a rank's state as
// bytes from one rank to all, checked end to end, the survivors' average, and the replica hash.

#include <cstdint>
#include <string>
#include <vector>

#include "comm/process_group/process_group.h"
#include "framework/nn/module.h"
#include "framework/tensor/tensor.h"
#include "framework/train/state_dict.h"

namespace hsgd::runtime::detail {

// FNV-1a over the bytes of the model's parameters. Buffers (BatchNorm statistics) may differ
// between replicas as optimizer state does: each rank updates them from its own batches.
uint64_t model_hash(nn::Module& model);

// "model 6 tensors, 535818 values (shapes 0123456789abcdef)": what every member must share.
std::string model_signature(nn::Module& model);

// Sends root's state to every rank of world (collective) and returns it: encoded with
// checkpoint::encode_state, preceded by its length and a CRC-32 of the bytes. A receiver whose
// bytes are short or do not match the checksum throws hsgd::CommError naming root, the
// lengths and the checksums ("the state from rank 0 is corrupt ...") before anything is
// restored. what names the transfer in messages and collective labels.
StateDict broadcast_state(comm::ProcessGroup& world, int root, int64_t step, const StateDict& state,
                          const std::string& what, int64_t* bytes_sent = nullptr);

// What the root sends before the state: its length and the CRC-32 of its bytes.
struct TransferHeader {
  int64_t length = 0;
  int64_t crc32 = 0;
};

// The receiving end of broadcast_state: the state in `bytes` (checkpoint::encode_state's
// encoding), checked against what root said it sent; throws hsgd::CommError as described above.
StateDict decode_transferred(const std::string& bytes, TransferHeader sent, int root,
                             const std::string& what);

// Averages tensors over the ranks with in_group (the others contribute zeros and receive the
// mean of the count ranks that contributed). Collective.
void average_over(comm::ProcessGroup& world, std::vector<Tensor> tensors, bool in_group, int count);

}  // namespace hsgd::runtime::detail
