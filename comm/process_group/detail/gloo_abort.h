#pragma once
// abort_gloo_connections: makes every Gloo operation pending on a context's connections fail at
// once, on this rank and on its peers (comm-internal; used when the collective watchdog found
// ranks in different collectives, so that no rank waits for the group's timeout).
//
// Gloo's Context::closeConnections() does not wake an operation of this process that waits on a
// closed connection (it waits for its own timeout). A socket shut down with shutdown(2) stays
// registered with Gloo's event loop, which then reads end-of-file and fails every operation
// pending on that pair, locally as on the peer. Gloo's TCP pairs do not expose their sockets,
// so they are found among this process's descriptors by their local address, which is the
// pair's address() (each pair binds its own). Afterwards the group is unusable, as after any
// failure.
//
// Usage (inside ProcessGroup; not compiled: uses its private members):
//   abort_gloo_connections(*context_);   // context_ is the group's gloo::Context

namespace gloo {
class Context;
}

namespace hsgd::detail {

// Returns the number of sockets shut down (0 if none could be found; then the connections are
// closed instead, which fails the peers' pending operations only).
int abort_gloo_connections(gloo::Context& context);

}  // namespace hsgd::detail
