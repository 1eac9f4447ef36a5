#pragma once
// Internal to Checkpointer: resuming a checkpoint on another world size. Only a checkpoint
// written while all replicas were equal may be resharded (SaveOptions::replicas_equal; load()
// checks it): each rank then reads every saved rank's file, and restores tensors (parameters,
// momentum buffers, ...) as their average over the saved ranks, which equal replicas average to
// themselves exactly, and every other value from saved rank (rank % saved world size). A
// DataLoader continues its epoch at the global number of samples seen (data_loader.h).
//
// Usage (rank 1 of 4 resumes a checkpoint of 2 ranks):
//   std::vector<int> read = detail::saved_ranks_to_read(/*saved_world=*/2, /*world=*/4, 1);
//   std::vector<StateDict> states(read.size());
//   // ... decode the files of the saved ranks in read into states ...
//   StateDict state = detail::reshard(std::move(states), /*rank=*/1, "ckpt/step_8");

#include <string>
#include <vector>

#include "framework/train/state_dict.h"

namespace hsgd::checkpoint::detail {

// The saved ranks whose files rank restores from: its own when the world size is unchanged,
// else every saved rank's.
std::vector<int> saved_ranks_to_read(int saved_world, int world, int rank);

// What rank restores from the states of saved_ranks_to_read (states.size() of them, by saved
// rank): the one state unchanged; of several, every tensor averaged (accumulated in double) and
// every other value taken from state rank % states.size(). Throws hsgd::InvalidArgument naming
// path and the entry when a tensor is missing on a saved rank or its shapes differ.
StateDict reshard(std::vector<StateDict> states, int rank, const std::string& path);

}  // namespace hsgd::checkpoint::detail
