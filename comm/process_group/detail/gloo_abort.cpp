#include "comm/process_group/detail/gloo_abort.h"

#include <gloo/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/address.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace hsgd::detail {

int abort_gloo_connections(gloo::Context& context) {
  std::vector<sockaddr_storage> mine;
  for (int peer = 0; peer < context.size; ++peer) {
    if (peer == context.rank) continue;
    const auto* address =
        dynamic_cast<const gloo::transport::tcp::Address*>(&context.getPair(peer)->address());
    if (address != nullptr) mine.push_back(address->getSockaddr());
  }
  int shut = 0;
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
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0) continue;
    sockaddr_storage peer{};
    socklen_t peer_length = sizeof(peer);
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) != 0) continue;
    for (const sockaddr_storage& address : mine) {
      if (std::memcmp(&address, &local, length) == 0) {
        ::shutdown(fd, SHUT_RDWR);
        ++shut;
        break;
      }
    }
  }
  if (shut == 0) context.closeConnections();
  return shut;
}

}  // namespace hsgd::detail
