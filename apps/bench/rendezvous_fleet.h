#pragma once
// run_fleet: many rendezvous clients driven by one thread, for rendezvous_bench. A thread per
// client (TcpStore's blocking API) stops scaling long before 16,384 clients on a small machine;
// here every client is a non-blocking socket in one epoll loop, speaking what TcpStore speaks
// (comm/rendezvous/proto/rendezvous.proto in the frames of comm/rendezvous/frame.h):
//   1. connect to 127.0.0.1:port from a loopback source address (see kClientsPerSourceAddress);
//   2. Hello {magic, version, job, owner}; wait for HelloReply {accepted};
//   3. Request {id 1, OP_SET, "rank<i>" = fleet_value(i)}; wait for Response {id 1, OK};
//   4. Request {id 2, OP_MULTI_GET, "rank0" .. "rank<N-1>"}; wait for Response {id 2, the N values
//      in key order}.
// The ids are the ones a fresh TcpStore gives its first two requests, so every client's multi_get
// frame is the same and is encoded once. Connections stay open until the whole fleet is done.
//
// Every value of every reply is checked. FleetCheck::kBytes compares the multi_get reply, as it
// streams in, byte for byte with the frame protobuf encodes for the expected Response (values
// right, in order, nothing else); it holds no reply whole. FleetCheck::kProtobuf assembles each
// reply, parses it into a proto::Response and compares its values one by one (what TcpStore
// does; it holds every reply in flight whole).
//
// Usage (one process running clients 0..1023 of a 1024-client job):
//   const FleetTimes t = run_fleet({.port = 29400, .job = "bench-0", .world = 1024,
//                                   .count = 1024,
//                                   .deadline = std::chrono::steady_clock::now() +
//                                               std::chrono::seconds(60)});

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace hsgd::bench {

// Client connections from one source address before the next one (127.0.0.2, .3, ...) is used,
// so that a run never exhausts the ephemeral ports of one address (28,232 here), even with the
// connections of earlier runs still in TIME_WAIT.
inline constexpr uint64_t kClientsPerSourceAddress = 8000;

enum class FleetCheck { kBytes, kProtobuf };

struct FleetOptions {
  int port = 0;
  std::string job = {};
  int world = 0;  // N: the keys are rank0 .. rank<N-1>
  int first = 0;  // this fleet runs clients first .. first + count - 1
  int count = 0;
  size_t value_bytes = 64;
  FleetCheck check = FleetCheck::kBytes;
  // Numbers this fleet's connections for the choice of source address (see
  // kClientsPerSourceAddress): pass a different base for every run.
  uint64_t connection_serial = 0;
  // Connections opened and not yet through their handshake, at most; 0: all at once.
  int max_connecting = 0;
  // Clients with a multi_get sent and not yet answered, at most (the others wait after their
  // set); 0: all at once. The first ones wait for the last key, the later ones find every key.
  int max_waiting = 0;
  std::chrono::steady_clock::time_point deadline = {};
};

struct FleetTimes {
  std::chrono::steady_clock::time_point last_connected;  // the last handshake answered
  std::chrono::steady_clock::time_point last_done;       // the last reply checked
};

// Runs the fleet until every client has checked its multi_get reply. Throws hsgd::CommError
// naming the first client that failed, in which step, and what it got instead; hsgd::Timeout
// saying how many clients were in which step when options.deadline passed. Closes every socket
// it opened either way.
FleetTimes run_fleet(const FleetOptions& options);

// The value client `rank` publishes: value_bytes bytes, different for every rank below 2^32.
std::string fleet_value(int rank, size_t value_bytes);

}  // namespace hsgd::bench
