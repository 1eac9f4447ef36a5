#pragma once
// "HOST:PORT" of an IPv4 or IPv6 socket address, for the transport's messages and logs ("?:0"
// for another family). Internal to comm/transport.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <string>

namespace hsgd::comm::transport::detail {

inline std::string sockaddr_text(const sockaddr_storage& address) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (address.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(address);
    ::inet_ntop(AF_INET, &in.sin_addr, host, sizeof(host));
    port = ntohs(in.sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(address);
    ::inet_ntop(AF_INET6, &in6.sin6_addr, host, sizeof(host));
    port = ntohs(in6.sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

}  // namespace hsgd::comm::transport::detail
