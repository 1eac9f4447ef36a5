#pragma once
// TlsDevice: the listening side of hsgd's TLS transport (see comm/transport/tls_device.h for the
// contract). Comm-internal.
//
// Accepting: one thread polls the listening socket; each accepted connection is handshaken on
// a thread of its own within options.handshake_timeout, so a client that sends nothing holds up
// no one. The server's key lookup answers only identities of this job that name a pair waiting
// (expect()) for exactly that peer; after the handshake the connection goes to that pair if it
// is still free (TlsPair::adopt), else it is closed.

#include <gloo/transport/device.h>
#include <sys/socket.h>

#include <atomic>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "comm/tls/tls.h"
#include "comm/transport/tls_device.h"

namespace hsgd::comm::transport::detail {

class TlsPair;

class TlsDevice : public gloo::transport::Device, public std::enable_shared_from_this<TlsDevice> {
 public:
  explicit TlsDevice(TlsDeviceOptions options);
  ~TlsDevice() override;  // stops accepting, ends the handshakes in flight
  TlsDevice(const TlsDevice&) = delete;
  TlsDevice& operator=(const TlsDevice&) = delete;

  std::string str() const override;
  const std::string& getPCIBusID() const override { return bus_id_; }
  std::shared_ptr<gloo::transport::Context> createContext(int rank, int size) override;

  const TlsDeviceOptions& options() const { return options_; }
  const sockaddr_storage& listen_address() const { return listen_address_; }
  const std::shared_ptr<tls::Context>& client_context() const { return client_context_; }
  uint64_t next_pair_id() { return next_pair_id_.fetch_add(1); }
  // What the pairs of every context of this device wrote (tls_bytes_written).
  void count_written(uint64_t bytes) { bytes_written_.fetch_add(bytes, std::memory_order_relaxed); }
  uint64_t bytes_written() const { return bytes_written_.load(std::memory_order_relaxed); }

  // pair (of rank `rank`, for peer `peer`) waits for its peer's connection under id, until
  // forget(id) (which the pair calls before it is destroyed).
  void expect(uint64_t id, int rank, int peer, TlsPair* pair);
  void forget(uint64_t id);

 private:
  struct Expected {
    int rank;
    int peer;
    TlsPair* pair;
  };
  struct Handshake {
    std::thread thread;
    int fd;
    bool done = false;
  };

  void accept_loop();
  void handshake(Handshake* self, int fd, const std::string& peer_address);
  std::optional<tls::Psk> lookup(std::string_view identity);
  void reap_finished();  // joins finished handshake threads; holds mu_

  // Constant after construction.
  const TlsDeviceOptions options_;
  const std::string bus_id_;
  std::shared_ptr<tls::Context> client_context_;
  std::shared_ptr<tls::Context> server_context_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd that ends accept_loop
  sockaddr_storage listen_address_{};
  std::thread acceptor_;
  std::atomic<uint64_t> next_pair_id_{1};
  std::atomic<uint64_t> bytes_written_{0};

  std::mutex mu_;
  std::map<uint64_t, Expected> expected_;  // guarded by mu_
  std::list<Handshake> handshakes_;        // guarded by mu_
  bool stopping_ = false;                  // guarded by mu_
};

}  // namespace hsgd::comm::transport::detail
