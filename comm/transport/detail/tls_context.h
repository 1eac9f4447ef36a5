#pragma once
// TlsContext: the pairs of one Gloo context over hsgd's TLS transport, and the matching of
// unbound-buffer messages to receives (comm-internal).
//
// Matching: a message for tag T from rank R goes to the oldest receive posted for T that accepts
// R; when there is none it is kept (copied) in arrival order, and a later receive takes the
// oldest kept message for T from any rank it accepts. A message still arriving when its receive
// is posted is claimed and delivered when complete, so per (rank, tag) order is kept.

#include <gloo/transport/context.h>

#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace hsgd::comm::transport::detail {

class TlsDevice;
class TlsPair;
class TlsUnboundBuffer;

class TlsContext : public gloo::transport::Context,
                   public std::enable_shared_from_this<TlsContext> {
 public:
  TlsContext(std::shared_ptr<TlsDevice> device, int rank, int size);
  ~TlsContext() override;  // closes the pairs and joins their threads first
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  std::unique_ptr<gloo::transport::Pair>& createPair(int rank) override;
  std::unique_ptr<gloo::transport::UnboundBuffer> createUnboundBuffer(void* ptr,
                                                                      size_t size) override;

  // The pair to rank; gloo::IoException when there is none.
  TlsPair& pair(int rank);

  // Where a message is delivered (see arrive()).
  struct Arrival {
    char* target = nullptr;              // where the payload goes
    TlsUnboundBuffer* buffer = nullptr;  // its receive, or nullptr: kept
    void* kept = nullptr;                // the kept message (an internal entry)
    uint64_t tag = 0;                    // the message's tag
    std::string error;                   // non-empty: the message cannot be received
  };
  // A pair's thread calls arrive() when a message's header arrived and arrived() when its
  // payload did.
  Arrival arrive(int src, uint64_t tag, size_t length);
  void arrived(int src, const Arrival& arrival);
  // Posts a receive of nbytes at target for tag from any of ranks.
  void post_recv(TlsUnboundBuffer* buffer, const std::vector<int>& ranks, uint64_t tag,
                 char* target, size_t nbytes);
  // Fails every receive that waits on rank (its pair failed).
  void fail_rank(int rank, const std::string& why);
  // Drops buffer's posted receives and sends (it is being destroyed).
  void forget(TlsUnboundBuffer* buffer);

 private:
  struct Posted {
    TlsUnboundBuffer* buffer;
    std::vector<int> ranks;
    uint64_t tag;
    char* target;
    size_t nbytes;
  };
  struct Kept {
    int src;
    uint64_t tag;
    std::vector<char> data;
    bool complete = false;
    TlsUnboundBuffer* claimed_by = nullptr;
    char* claimed_target = nullptr;
  };

  const std::shared_ptr<TlsDevice> device_;
  std::mutex match_mu_;
  std::list<Posted> posted_;  // guarded by match_mu_, oldest first
  std::list<Kept> kept_;      // guarded by match_mu_, oldest first
};

}  // namespace hsgd::comm::transport::detail
