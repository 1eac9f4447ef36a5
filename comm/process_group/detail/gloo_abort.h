#pragma once
// abort_gloo_connections: makes every Gloo operation pending on a context's connections fail at
// once, on this rank and on its peers (comm-internal; used when the collective watchdog found
// ranks in different collectives, so that no rank waits for the group's timeout).
//
// Gloo's Context::closeConnections() does not wake an operation of this process that waits on a
// closed connection (it waits for its own timeout). A socket shut down with shutdown(2) stays
// registered with Gloo's event loop, which then reads end-of-file and fails every operation
// pending on that pair, locally as on the peer. Gloo's TCP pairs expose neither their sockets
// nor their peers' addresses, so the sockets are found among this process's descriptors by both
// ends of each connection: the local one is the pair's address() (once connected, the socket's
// own address), the remote one the peer's pair's address(), which every member publishes in the
// store once connected (publish_gloo_connections). The local address alone is not enough: the
// kernel gives the connecting side of several connections the same local port when their peers
// differ, so that the abort of one group of a process would also shut down another group's
// connection (or the store's). Afterwards the group is unusable, as after any failure; the
// other groups of the process are untouched.
//
// hsgd's TLS transport (comm/transport) needs none of this: its Pair::close() shuts its own
// socket down and wakes its waiters, so aborting closes the context's pairs.
//
// Usage (inside ProcessGroup; not compiled: uses its private members):
//   publish_gloo_connections(*context_, *options_.store, options_.key_prefix);  // once connected
//   abort_gloo_connections(*context_, *options_.store, options_.key_prefix);

#include <sys/socket.h>

#include <string>
#include <vector>

#include "comm/store/store.h"

namespace gloo {
class Context;
}

namespace hsgd::detail {

// One TCP connection as this process sees it.
struct SocketEnds {
  sockaddr_storage local{};
  sockaddr_storage peer{};
};

// Stores the local address of each of this rank's pairs (by peer rank) under
// "<key_prefix>gloo_ends/<rank>". Call once connectFullMesh returned.
void publish_gloo_connections(gloo::Context& context, comm::Store& store,
                              const std::string& key_prefix);

// Shuts down this rank's connections of context, found by the addresses the members published.
// A peer whose addresses are not in the store (or cannot be read within 1 s) is matched by the
// local address alone, and only when no other socket of this process has that address. Returns the
// number of sockets shut down (0 if none could be found; then the connections are closed instead,
// which fails the peers' pending operations only). Over the TLS transport: closes every pair and
// returns their number.
int abort_gloo_connections(gloo::Context& context, comm::Store& store,
                           const std::string& key_prefix);

// Shuts down (SHUT_RDWR) every socket of this process whose local and peer addresses are those
// of one of `connections` (family, address and port compared); returns how many. Other sockets,
// including ones that share a local address with a listed connection, are left alone.
int shutdown_connections(const std::vector<SocketEnds>& connections);

}  // namespace hsgd::detail
