#pragma once
// TlsBuffer and TlsUnboundBuffer: Gloo's bound and unbound buffers over hsgd's TLS transport
// (comm-internal). A bound buffer belongs to one pair and slot; the state that the pair's
// I/O thread updates is guarded by the pair's mutex. An unbound buffer may have several sends
// and receives in flight, to and from several ranks; each wait consumes one completion and
// reports its rank.

#include <gloo/transport/buffer.h>
#include <gloo/transport/unbound_buffer.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace hsgd::comm::transport::detail {

class TlsContext;
class TlsPair;

class TlsBuffer : public gloo::transport::Buffer {
 public:
  TlsBuffer(TlsPair& pair, int slot, void* ptr, size_t size, bool recv);
  ~TlsBuffer() override;
  void send(size_t offset, size_t length, size_t roffset) override;
  void waitRecv() override;
  void waitSend() override;

  int slot() const { return slot_; }
  char* data() const { return static_cast<char*>(ptr_); }
  size_t size() const { return size_; }

 private:
  friend class TlsPair;
  TlsPair& pair_;
  const bool recv_;
  int recvs_done_ = 0;  // guarded by the pair's mutex
  int sends_done_ = 0;  // guarded by the pair's mutex
};

class TlsUnboundBuffer : public gloo::transport::UnboundBuffer {
 public:
  TlsUnboundBuffer(std::shared_ptr<TlsContext> context, void* ptr, size_t size);
  ~TlsUnboundBuffer() override;

  bool waitRecv(int* rank, std::chrono::milliseconds timeout) override;
  bool waitSend(int* rank, std::chrono::milliseconds timeout) override;
  void abortWaitRecv() override;
  void abortWaitSend() override;
  void send(int dst, uint64_t slot, size_t offset, size_t nbytes) override;
  void recv(int src, uint64_t slot, size_t offset, size_t nbytes) override;
  void recv(std::vector<int> srcs, uint64_t slot, size_t offset, size_t nbytes) override;

  // The transport reports completions and failures.
  void recv_done(int src);
  void send_done(int dst);
  void fail(const std::string& why);

 private:
  bool wait(std::deque<int>& done, bool& aborted, int* rank, std::chrono::milliseconds timeout,
            const char* what);
  size_t checked_length(size_t offset, size_t nbytes, const char* what) const;

  const std::shared_ptr<TlsContext> context_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> recvs_done_;  // guarded by mu_
  std::deque<int> sends_done_;  // guarded by mu_
  std::string error_;           // guarded by mu_
  bool abort_recv_ = false;     // guarded by mu_
  bool abort_send_ = false;     // guarded by mu_
  std::string last_recv_from_;  // guarded by mu_: for the timeout's message
  std::string last_send_to_;    // guarded by mu_
};

}  // namespace hsgd::comm::transport::detail
