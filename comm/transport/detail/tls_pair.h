#pragma once
// TlsPair: one TLS connection between two ranks of a context (comm-internal; the contract is in
// comm/transport/tls_device.h).
//
// Protocol:
// 1. createPair: a pair whose peer has the lower rank registers with the device and waits for
//    the peer's connection; the other one will connect.
// 2. connect(peer's address): the connecting side opens TCP to the peer's device and runs the
//    TLS client handshake as "<rank> -> <peer> <peer's pair id>"; the accepting side waits until
//    the device handed it an authenticated connection (adopt). Both within the context timeout.
// 3. One I/O thread per pair owns the SSL object: it writes queued frames (from the senders'
//    memory, which must stay valid until waitSend) and reads frames into bound buffers, posted
//    unbound receives, or kept copies, never waiting for one direction while the other is stuck.
// 4. A failure (peer closed, TLS error, close()) fails every pending operation of the pair with
//    a gloo::IoException naming the peer; completed ones stay completed.

#include <gloo/transport/address.h>
#include <gloo/transport/pair.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/transport/detail/tls_context.h"
#include "comm/transport/detail/tls_socket.h"
#include "comm/transport/detail/wire.h"

namespace hsgd::comm::transport::detail {

class TlsBuffer;
class TlsContext;
class TlsDevice;
class TlsUnboundBuffer;

class TlsAddress : public gloo::transport::Address {
 public:
  explicit TlsAddress(const WireAddress& wire) : wire_(wire) {}
  std::string str() const override;
  std::vector<char> bytes() const override;
  const WireAddress& wire() const { return wire_; }

 private:
  WireAddress wire_;
};

class TlsPair : public gloo::transport::Pair {
 public:
  TlsPair(TlsContext& context, TlsDevice& device, int peer);
  ~TlsPair() override;  // closes, joins the I/O thread
  TlsPair(const TlsPair&) = delete;
  TlsPair& operator=(const TlsPair&) = delete;

  const gloo::transport::Address& address() const override { return address_; }
  void connect(const std::vector<char>& bytes) override;
  void close() override;
  void setSync(bool, bool) override {}  // the I/O thread always drives the connection
  std::unique_ptr<gloo::transport::Buffer> createSendBuffer(int slot, void* ptr,
                                                            size_t size) override;
  std::unique_ptr<gloo::transport::Buffer> createRecvBuffer(int slot, void* ptr,
                                                            size_t size) override;
  void send(gloo::transport::UnboundBuffer* buffer, uint64_t tag, size_t offset,
            size_t nbytes) override;
  void recv(gloo::transport::UnboundBuffer* buffer, uint64_t tag, size_t offset,
            size_t nbytes) override;

  int peer() const { return peer_; }
  // Why the pair failed, or "" while it works.
  std::string failure() const;
  int rank() const;
  // Device: hands over an authenticated connection; false (the caller closes it) when the pair
  // already has one or was closed.
  bool adopt(std::unique_ptr<TlsSocket> socket);

  // Buffers (tls_buffers.cpp).
  void send_bound(TlsBuffer& buffer, size_t offset, size_t length, size_t roffset);
  void send_unbound(TlsUnboundBuffer& buffer, uint64_t tag, const char* data, size_t nbytes);
  // Tells the peer that a receive took its message of tag (a kAck frame).
  void acknowledge(uint64_t tag);
  void register_recv(TlsBuffer& buffer);
  void unregister(TlsBuffer& buffer);
  // Owner (a buffer) is being destroyed: its queued sends go from a copy; a transfer in flight
  // to or from its memory is waited for (within the timeout, else the pair is closed).
  void forget(const void* owner);
  void wait_recv(TlsBuffer& buffer);
  void wait_send(TlsBuffer& buffer);

 private:
  struct Outgoing {
    FrameHeader header{};
    const char* data = nullptr;
    TlsBuffer* bound = nullptr;
    TlsUnboundBuffer* unbound = nullptr;
    std::shared_ptr<std::vector<char>> owned = nullptr;  // the payload, when its buffer is gone
  };
  struct Early {  // a bound message that arrived before its receive buffer
    uint64_t offset;
    std::vector<char> data;
    bool complete = false;
  };

  void run();          // the I/O thread
  void write_ready();  // writes queued frames until the socket is full or the queue empty
  void read_ready();   // reads frames until no bytes are available (or a budget is spent)
  void acknowledged(uint64_t tag);  // the peer's kAck
  void begin_payload();
  void end_payload();
  void fail(const std::string& why);
  void deliver_early(uint64_t slot);  // holds mu_
  void wait(TlsBuffer& buffer, bool recv);
  void wake();
  std::string describe() const;  // "rank 1 -> rank 3"

  // Constant after construction.
  TlsContext& context_;
  TlsDevice& device_;
  const int peer_;
  const bool accepting_;  // the peer connects to us
  const TlsAddress address_;
  const int wake_fd_;  // an eventfd that wakes the I/O thread

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<TlsSocket> socket_;  // guarded by mu_ until the I/O thread starts
  std::string error_;                  // guarded by mu_; non-empty once failed
  bool closed_ = false;                // guarded by mu_
  bool io_running_ = false;            // guarded by mu_
  std::deque<Outgoing> outgoing_;      // guarded by mu_
  // Unbound messages written, whose sends complete when the peer's kAck for their tag arrives.
  std::deque<std::pair<uint64_t, TlsUnboundBuffer*>> unacknowledged_;  // guarded by mu_
  std::map<uint64_t, TlsBuffer*> recv_buffers_;                        // guarded by mu_, by slot
  std::map<uint64_t, std::deque<Early>> early_;                        // guarded by mu_, by slot
  const void* write_owner_ = nullptr;  // guarded by mu_: whose memory the I/O thread reads
  const void* read_owner_ = nullptr;   // guarded by mu_: whose memory the I/O thread writes
  std::thread io_;
  // Bytes the I/O thread handed to TLS so far: the destructor's measure of progress.
  std::atomic<uint64_t> bytes_written_{0};

  // Messages up to this size (header included) are copied into one TLS record: 16 KiB, TLS's
  // largest record.
  static constexpr size_t kCoalesceBytes = 16 << 10;
  // The destructor stops waiting for queued messages to go out once nothing was written for
  // this long: the peer stopped reading or the link is gone, and waiting longer only delays the
  // process's exit (up to the context timeout).
  static constexpr std::chrono::seconds kDrainStall{5};

  // The I/O thread's own state.
  std::vector<char> staged_;  // header and payload of a small message
  Outgoing current_{};
  size_t current_done_ = 0;  // bytes of header then payload written
  bool writing_ = false;
  FrameHeader in_{};
  size_t in_header_got_ = 0;
  char* in_target_ = nullptr;
  size_t in_left_ = 0;
  bool in_payload_ = false;
  TlsBuffer* in_bound_ = nullptr;
  Early* in_early_ = nullptr;
  TlsContext::Arrival in_arrival_;  // where an unbound message goes
};

}  // namespace hsgd::comm::transport::detail
