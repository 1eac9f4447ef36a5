#include "comm/process_group/detail/gloo_abort.h"

#include <gloo/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/address.h>
#include <netinet/in.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>

namespace hsgd::detail {
namespace {

std::string ends_key(const std::string& key_prefix, int rank) {
  return key_prefix + "gloo_ends/" + std::to_string(rank);
}

// The local address of the pair to peer, or nullopt for a transport other than TCP.
std::optional<sockaddr_storage> pair_address(gloo::Context& context, int peer) {
  const auto* address =
      dynamic_cast<const gloo::transport::tcp::Address*>(&context.getPair(peer)->address());
  if (address == nullptr) return std::nullopt;
  return address->getSockaddr();
}

bool same_address(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto& x = reinterpret_cast<const sockaddr_in&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port &&
           std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof(x.sin6_addr)) == 0;
  }
  return false;
}

// Calls visit(fd, ends) for every connected socket of this process.
void for_each_connected_socket(const std::function<void(int, const SocketEnds&)>& visit) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", error)) {
    int fd = -1;
    try {
      fd = std::stoi(entry.path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    struct stat info {};
    if (::fstat(fd, &info) != 0 || !S_ISSOCK(info.st_mode)) continue;
    SocketEnds ends;
    socklen_t length = sizeof(ends.local);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ends.local), &length) != 0) continue;
    length = sizeof(ends.peer);
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ends.peer), &length) != 0) continue;
    visit(fd, ends);
  }
}

}  // namespace

void publish_gloo_connections(gloo::Context& context, comm::Store& store,
                              const std::string& key_prefix) {
  // One sockaddr_storage per rank, this rank's own left zero.
  comm::Bytes value(sizeof(sockaddr_storage) * static_cast<size_t>(context.size), 0);
  for (int peer = 0; peer < context.size; ++peer) {
    if (peer == context.rank) continue;
    if (const auto address = pair_address(context, peer)) {
      std::memcpy(value.data() + sizeof(sockaddr_storage) * static_cast<size_t>(peer), &*address,
                  sizeof(sockaddr_storage));
    }
  }
  store.set(ends_key(key_prefix, context.rank), value);
}

int shutdown_connections(const std::vector<SocketEnds>& connections) {
  int shut = 0;
  for_each_connected_socket([&](int fd, const SocketEnds& ends) {
    for (const SocketEnds& connection : connections) {
      if (same_address(connection.local, ends.local) && same_address(connection.peer, ends.peer)) {
        ::shutdown(fd, SHUT_RDWR);
        ++shut;
        return;
      }
    }
  });
  return shut;
}

int abort_gloo_connections(gloo::Context& context, comm::Store& store,
                           const std::string& key_prefix) {
  if (context.size > 1 && !pair_address(context, context.rank == 0 ? 1 : 0)) {
    // hsgd's TLS transport: closing a pair shuts its socket down and fails the operations
    // pending on it, here and on the peer.
    context.closeConnections();
    return context.size - 1;
  }
  std::vector<SocketEnds> known;             // both ends
  std::vector<sockaddr_storage> local_only;  // the peer's addresses could not be read
  for (int peer = 0; peer < context.size; ++peer) {
    if (peer == context.rank) continue;
    const auto local = pair_address(context, peer);
    if (!local) continue;
    std::optional<comm::Bytes> published;
    try {
      const std::string key = ends_key(key_prefix, peer);
      if (store.check({key})) published = store.get(key, std::chrono::seconds(1));
    } catch (const std::exception&) {
      // The store may be gone (the job is ending): match by the local address below.
    }
    const size_t offset = sizeof(sockaddr_storage) * static_cast<size_t>(context.rank);
    if (published && published->size() >= offset + sizeof(sockaddr_storage)) {
      SocketEnds ends{.local = *local};
      std::memcpy(&ends.peer, published->data() + offset, sizeof(sockaddr_storage));
      known.push_back(ends);
    } else {
      local_only.push_back(*local);
    }
  }
  // A local address without its peer identifies a connection only when no other socket has it.
  for (const sockaddr_storage& local : local_only) {
    std::vector<SocketEnds> matches;
    for_each_connected_socket([&](int, const SocketEnds& ends) {
      if (same_address(local, ends.local)) matches.push_back(ends);
    });
    if (matches.size() == 1) known.push_back(matches.front());
  }
  const int shut = shutdown_connections(known);
  if (shut == 0) context.closeConnections();
  return shut;
}

}  // namespace hsgd::detail
