#pragma once
// torchrun's variables: Kubeflow's PyTorchJob (and anything else that drives torchrun through
// its environment) passes torchrun's arguments as PET_<ARGUMENT> variables. hsgd-run reads the
// same ones, so a manifest that runs torchrun runs hsgd-run with only the image and the command
// changed:
//   PET_NNODES           --nnodes (N, N:N, or MIN:MAX for an elastic job)
//   PET_NPROC_PER_NODE   --nproc-per-node (a number; 'auto' or 'cpu': this machine's cores)
//   PET_NODE_RANK        --node-rank
//   PET_RDZV_ID          --rdzv-id
//   PET_RDZV_ENDPOINT    --rdzv-endpoint; without it PET_MASTER_ADDR:PET_MASTER_PORT
//   PET_RDZV_BACKEND     'static' or 'c10d' (hsgd-run's own rendezvous either way); others are
//                        refused by name
// Precedence: a flag, then its HSGD_* variable, then PET_*, then the Slurm step.
// When the endpoint comes from PET_*, the node of rank 0 hosts the rendezvous server on it (like
// torchrun's static rendezvous, whose node 0 hosts the TCPStore on MASTER_ADDR:MASTER_PORT); a
// node without a rank hosts it when the endpoint's host is this machine's hostname.
//
// Usage (in parse_flags, after the command line is parsed):
//   hsgd::run::Flags flags;
//   hsgd::run::TorchEnvGiven given{.nnodes = false, .nproc_per_node = true};  // set by flags
//   hsgd::run::apply_torch_env(flags, given);  // PET_NNODES, if set, now gave flags.nnodes

#include "apps/hsgd-run/flags.h"

namespace hsgd::run {

// Which settings the command line or HSGD_* already gave; PET_* fill only the others.
struct TorchEnvGiven {
  bool nnodes = false;
  bool nproc_per_node = false;
  bool node_rank = false;
  bool rdzv_id = false;
  bool endpoint = false;
};

// Applies the PET_* variables that are set to what `given` leaves open, and marks in `given` what
// they set (the Slurm step then fills only the rest). Throws UsageError naming the variable, its
// value and what was expected.
void apply_torch_env(Flags& flags, TorchEnvGiven& given);

}  // namespace hsgd::run
