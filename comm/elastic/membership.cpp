#include "comm/elastic/membership.h"

#include <sstream>

#include "comm/error.h"

namespace hsgd::comm::elastic {
namespace {

// Ids and hosts are written space-separated: neither may hold white space or be empty.
void check_word(const std::string& what, const std::string& value) {
  HSGD_CHECK_AS(CommError, !value.empty(), "elastic membership: empty ", what);
  for (char c : value) {
    HSGD_CHECK_AS(CommError, c != ' ' && c != '\n' && c != '\t', "elastic membership: ", what, " '",
                  value, "' holds white space");
  }
}

std::optional<int64_t> read_int(Store& store, const std::string& key) {
  if (!store.check({key})) return std::nullopt;
  const std::string text = to_string(store.get(key, std::chrono::seconds(10)));
  try {
    return std::stoll(text);
  } catch (const std::exception&) {
    HSGD_CHECK_AS(CommError, false, "elastic membership: key ", key, " holds '", text,
                  "', expected an integer");
  }
  return std::nullopt;
}

}  // namespace

int Generation::world_size() const {
  int total = 0;
  for (const MemberNode& node : nodes) total += node.local_world_size;
  return total;
}

int Generation::node_rank(const std::string& id) const {
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].id == id) return static_cast<int>(i);
  }
  return -1;
}

int Generation::rank_offset(const std::string& id) const {
  int offset = 0;
  for (const MemberNode& node : nodes) {
    if (node.id == id) return offset;
    offset += node.local_world_size;
  }
  return -1;
}

std::string Generation::describe() const {
  std::string out;
  for (const MemberNode& node : nodes) {
    if (!out.empty()) out += ' ';
    out += node.id + "(" + node.host + "," + std::to_string(node.local_world_size) + ")";
  }
  return out;
}

std::string Generation::encode() const {
  std::string out = "generation " + std::to_string(number) + "\n";
  for (const MemberNode& node : nodes) {
    check_word("node id", node.id);
    check_word("host", node.host);
    out += node.id + " " + node.host + " " + std::to_string(node.local_world_size) + "\n";
  }
  return out;
}

Generation Generation::decode(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  Generation g;
  std::string word;
  std::getline(in, line);
  std::istringstream header(line);
  HSGD_CHECK_AS(
      CommError,
      (header >> word >> g.number) && word == "generation" && g.number >= 0 && !(header >> word),
      "elastic membership: not a generation record: '", text.substr(0, 80), "'");
  // One node per line, exactly "id host lws": a truncated line is garbage, not the end.
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream fields(line);
    MemberNode node;
    HSGD_CHECK_AS(
        CommError, (fields >> node.id >> node.host >> node.local_world_size) && !(fields >> word),
        "elastic membership: garbage in generation ", g.number, ": '", line.substr(0, 80), "'");
    HSGD_CHECK_AS(CommError, node.local_world_size >= 1, "elastic membership: node ", node.id,
                  " has local world size ", node.local_world_size, ", expected >= 1");
    g.nodes.push_back(node);
  }
  return g;
}

std::string node_key(const std::string& id) { return kElasticPrefix + "node/" + id; }
std::string left_key(const std::string& id) { return kElasticPrefix + "left/" + id; }
std::string alive_key(const std::string& id) { return kElasticPrefix + "alive/" + id; }
std::string generation_key(int64_t number) {
  return kElasticPrefix + "gen/" + std::to_string(number);
}
std::string slot_key(int64_t slot) { return kElasticPrefix + "slot/" + std::to_string(slot); }
std::string generation_prefix(int64_t number) {
  return kElasticPrefix + "g" + std::to_string(number) + "/";
}

std::string failed_key(int64_t number) { return generation_prefix(number) + "failed"; }

std::optional<Generation> read_latest_generation(Store& store) {
  int64_t number = read_int(store, kLatestKey).value_or(-1);
  // A proposer writes gen/<g> before latest: follow newer records it has not announced yet.
  while (store.check({generation_key(number + 1)})) ++number;
  if (number < 0) return std::nullopt;
  return Generation::decode(to_string(store.get(generation_key(number), std::chrono::seconds(10))));
}

Generation propose_generation(Store& store, const Generation& proposal) {
  const CompareSetResult result =
      store.compare_set(generation_key(proposal.number), {}, to_bytes(proposal.encode()));
  const Generation stored = Generation::decode(to_string(result.current));
  // latest only grows: a slow writer must not move it back.
  for (;;) {
    const Bytes current = store.check({kLatestKey}) ? store.get(kLatestKey) : Bytes{};
    const int64_t now = current.empty() ? -1 : std::stoll(to_string(current));
    if (now >= stored.number) break;
    if (store.compare_set(kLatestKey, current, to_bytes(std::to_string(stored.number))).swapped) {
      break;
    }
  }
  return stored;
}

namespace {

// The first slot from the counter on that no other incarnation holds, taken for id. After a
// server restart the counter may be below slots that live incarnations hold again: those are
// skipped, never overwritten.
int64_t claim_slot(Store& store, const std::string& id) {
  constexpr int kMaxAttempts = 10000;
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    const int64_t slot = store.add(kSlotsKey, 1) - 1;
    const CompareSetResult result = store.compare_set(slot_key(slot), Bytes{}, to_bytes(id));
    if (result.swapped || to_string(result.current) == id) return slot;
  }
  HSGD_THROW(CommError, "elastic membership: no free slot for node ", id, " after ", kMaxAttempts,
             " attempts (", kSlotsKey, " and the slot keys disagree)");
}

}  // namespace

int64_t register_node(Store& store, const MemberNode& node, Duration alive_linger) {
  check_word("node id", node.id);
  check_word("host", node.host);
  // First: whoever sees the registration finds the alive key (a restarted server gets them back
  // in this order too, owned keys first).
  store.set_owned(alive_key(node.id), to_bytes("1"), alive_linger);
  store.set(node_key(node.id), to_bytes(node.host + " " + std::to_string(node.local_world_size)));
  return claim_slot(store, node.id);
}

int64_t keep_registration(Store& store, const MemberNode& node, int64_t slot) {
  const std::string key = slot_key(slot);
  if (store.check({key}) && to_string(store.get(key, std::chrono::seconds(10))) == node.id) {
    const int64_t count = read_int(store, kSlotsKey).value_or(0);
    if (count <= slot) store.add(kSlotsKey, slot + 1 - count);
    return slot;
  }
  return claim_slot(store, node.id);
}

std::vector<Registration> read_registrations(Store& store) {
  std::vector<Registration> out;
  const int64_t slots = read_int(store, kSlotsKey).value_or(0);
  for (int64_t j = 0; j < slots; ++j) {
    // A registration between its add and its slot's set is not visible yet.
    if (!store.check({slot_key(j)})) continue;
    Registration r;
    r.node.id = to_string(store.get(slot_key(j), std::chrono::seconds(10)));
    std::istringstream record(to_string(store.get(node_key(r.node.id), std::chrono::seconds(10))));
    HSGD_CHECK_AS(CommError, record >> r.node.host >> r.node.local_world_size,
                  "elastic membership: bad node record for ", r.node.id);
    r.left = store.check({left_key(r.node.id)});
    if (!r.left) r.connected = store.check({alive_key(r.node.id)});
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace hsgd::comm::elastic
