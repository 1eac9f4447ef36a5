#include "comm/launcher/failure_record.h"

#include <sstream>

#include "comm/error.h"
#include "comm/rendezvous/rendezvous_server_tokens.h"

namespace hsgd::comm::launcher {

// Format: four header lines (kind, node rank, rank, signal), then the message verbatim.
std::string FailureRecord::encode() const {
  std::ostringstream out;
  out << static_cast<int>(kind) << '\n'
      << node_rank << '\n'
      << rank << '\n'
      << signal << '\n'
      << message;
  return out.str();
}

FailureRecord FailureRecord::decode(const std::string& text) {
  std::istringstream in(text);
  std::string kind, node, rank, sig;
  FailureRecord r;
  try {
    if (!std::getline(in, kind) || !std::getline(in, node) || !std::getline(in, rank) ||
        !std::getline(in, sig)) {
      throw std::invalid_argument("missing header line");
    }
    const int k = std::stoi(kind);
    if (k < 0 || k > static_cast<int>(Kind::kWillRepeat)) throw std::invalid_argument("kind");
    r.kind = static_cast<Kind>(k);
    r.node_rank = std::stoi(node);
    r.rank = std::stoi(rank);
    r.signal = std::stoi(sig);
  } catch (const std::exception&) {
    HSGD_THROW(CommError, "malformed failure record in the store: '", printable_excerpt(text, 200),
               "'");
  }
  std::ostringstream rest;
  rest << in.rdbuf();
  r.message = rest.str();
  return r;
}

FailureRecord FailureRecord::from_store(const std::string& text, int attempt) {
  try {
    return decode(text);
  } catch (const Error&) {
    return FailureRecord{.kind = Kind::kWorkerFailed,
                         .message = "malformed failure record in the store for attempt " +
                                    std::to_string(attempt) + " ('" + printable_excerpt(text, 120) +
                                    "'): counted as a failure of that attempt"};
  }
}

}  // namespace hsgd::comm::launcher
