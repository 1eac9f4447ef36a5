#pragma once
// Elastic membership: which nodes form each generation of an elastic job (hsgd-run --nnodes
// MIN:MAX), as the agents decide it and the workers read it, through the job's store.
//
// The node is the unit: a generation is an ordered list of node incarnations, each with its
// number of workers. A node's index in the list is its node rank; its workers' global ranks are
// the sum of the local world sizes before it plus their local rank. A node that fails and comes
// back is a new incarnation with a new id, never the old one.
//
// Keys (in the job's store namespace; no attempt prefix, an elastic job has no attempts):
//   hsgd-run/elastic/node/<id>     the NodeRecord of a registered incarnation ("host lws")
//   hsgd-run/elastic/slots         counter: at least the registrations so far (each agent keeps
//                                  it above its own slot: keep_registration)
//   hsgd-run/elastic/slot/<j>      the id of the incarnation that holds slot j (j from the
//                                  counter, taken with compare_set: a held slot is skipped)
//   hsgd-run/elastic/alive/<id>    set by the incarnation's agent before it registers, as a key
//                                  owned by its store client (Store::set_owned): the rendezvous
//                                  server deletes it soon after that process's connections
//                                  closed (it exited or was killed, not a host that vanished)
//   hsgd-run/elastic/left/<id>     set once the incarnation is gone (its agent says so, or
//                                  another agent found its heartbeat silent or its alive key
//                                  gone)
//   hsgd-run/elastic/gen/<g>       Generation g, written once by compare_set: of two agents
//                                  proposing generation g, the first wins and both adopt it
//   hsgd-run/elastic/latest        decimal g of the newest generation, written after gen/<g>;
//                                  readers follow gen/<latest+1>... in case a writer is behind
//   hsgd-run/elastic/finished      set when a node's workers all finished training (exit 0):
//                                  from then on nobody proposes generations
//   hsgd-run/elastic/g<g>/failed
//                                  set by a worker whose world of generation g failed (a
//                                  collective lost a member or timed out): the decimal ms its
//                                  collectives wait (their timeout). The agents then drop at once
//                                  the members of g whose heartbeat has been silent for half that
//                                  long (elastic_agent.h), instead of after the heartbeat timeout
//   hsgd-run/elastic/steps_thrown_away
//                                  counter: worker-steps of training thrown away by membership
//                                  changes, added by the workers (the agents report the sum)
// Generation numbers start at 0 and grow by one; keys of old generations are never read again
// by anyone who has seen a newer one. Workers put their own keys (process groups) under
// generation_prefix(g).
//
// Usage:
//   using namespace hsgd::comm::elastic;
//   Generation g{.number = 0, .nodes = {{.id = "a-17-0", .host = "a", .local_world_size = 2},
//                                       {.id = "b-9-0", .host = "b", .local_world_size = 2}}};
//   const std::string text = g.encode();
//   Generation back = Generation::decode(text);   // back.rank_offset("b-9-0") == 2

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/store/store.h"

namespace hsgd::comm::elastic {

// One node incarnation as registered by its agent.
struct MemberNode {
  std::string id{};  // unique per incarnation: "<host>-<agent pid>-<incarnation>"
  std::string host{};
  int local_world_size = 1;

  bool operator==(const MemberNode&) const = default;
};

struct Generation {
  int64_t number = 0;
  std::vector<MemberNode> nodes{};  // in node-rank order

  int world_size() const;
  // The node rank of id, or -1 when id is not a member.
  int node_rank(const std::string& id) const;
  // The global rank of id's local rank 0, or -1 when id is not a member.
  int rank_offset(const std::string& id) const;
  // "node0-id(host,lws) node1-id(...)" for logs.
  std::string describe() const;

  // One line per node "id host lws" after a first line "generation <g>".
  std::string encode() const;
  // Throws hsgd::CommError naming what is wrong when text is not encode()'s output.
  static Generation decode(const std::string& text);

  bool operator==(const Generation&) const = default;
};

inline const std::string kElasticPrefix = "hsgd-run/elastic/";
std::string node_key(const std::string& id);
std::string left_key(const std::string& id);
std::string alive_key(const std::string& id);
std::string generation_key(int64_t number);
inline const std::string kSlotsKey = kElasticPrefix + "slots";
std::string slot_key(int64_t slot);
inline const std::string kLatestKey = kElasticPrefix + "latest";
inline const std::string kFinishedKey = kElasticPrefix + "finished";
inline const std::string kStepsThrownAwayKey = kElasticPrefix + "steps_thrown_away";
// Where the workers of generation `number` keep their keys: "hsgd-run/elastic/g<number>/".
std::string generation_prefix(int64_t number);
// generation_prefix(number) + "failed" (see above).
std::string failed_key(int64_t number);

// The newest generation in the store (kLatestKey, then gen/<latest+1>... while they exist), or
// nullopt before generation 0. Does not block.
std::optional<Generation> read_latest_generation(Store& store);

// Writes `proposal` as generation proposal.number unless another agent wrote that number first,
// then advances kLatestKey. Returns the generation that holds that number (the proposal or the
// earlier one).
Generation propose_generation(Store& store, const Generation& proposal);

// Registers an incarnation: its alive key (owned, lingering alive_linger after this client's
// connections closed), its node record and the next free slot (one that no other incarnation
// holds). Returns the slot.
int64_t register_node(Store& store, const MemberNode& node,
                      Duration alive_linger = std::chrono::seconds(1));
// Keeps a registration listed after the rendezvous server was restarted and its clients
// re-published the job: the slots counter (a sum of the clients' shares) lacks the shares of the
// clients that died meanwhile, so it may be at or below `slot`, which read_registrations would
// then skip; and `slot` may now name another incarnation (this one took it while the counter was
// low, then its earlier holder re-published it). Raises the counter above `slot` when `slot`
// still holds node.id, else takes the next free slot. Returns the slot held.
// Called by an agent that does not find its incarnation among read_registrations.
int64_t keep_registration(Store& store, const MemberNode& node, int64_t slot);
// Every registered incarnation in slot order, with whether it has left (left/<id> set) and,
// while it has not, whether its alive key is still there.
struct Registration {
  MemberNode node;
  bool left = false;
  bool connected = true;  // alive/<id> exists (read only when not left)
};
std::vector<Registration> read_registrations(Store& store);

}  // namespace hsgd::comm::elastic
