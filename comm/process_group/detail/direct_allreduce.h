#pragma once
// hsgd's own pinned allreduce algorithms over a Gloo context (comm-internal): DirectExchange for
// small buffers, DirectScatterGather for larger ones. Both sum the ranks' contributions in rank
// order, so every rank ends with the same bits, and both reduce the caller's buffer through
// run_on(data). GlooAllreduce builds them once per (type, count, op) and caches them.
//
// CONTRACT: like Gloo's algorithms, every rank of the context builds the same algorithms in the
// same order (the slots they take must agree) and calls run_on in the same sequence. Errors are
// Gloo's exceptions (timeouts, lost connections).
//
// Usage (GlooAllreduce's cache; not compiled: needs a connected Gloo context):
//   DirectExchange<float> exchange(context, count, gloo::ReductionFunction<float>::sum);
//   exchange.run_on(data);  // data is (count,)

#include <gloo/algorithm.h>
#include <gloo/context.h>
#include <gloo/transport/buffer.h>
#include <gloo/transport/pair.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <vector>

namespace hsgd::detail {

// A pinned algorithm that reduces the caller's buffer, which may differ from call to call: it
// registers only buffers of its own with the pairs. run() has no buffer to reduce and throws.
template <typename T>
class CallerBufferAlgorithm : public gloo::Algorithm {
 public:
  using gloo::Algorithm::Algorithm;
  void run() override { throw std::logic_error("CallerBufferAlgorithm::run: use run_on(data)"); }
  // data is (count,) as constructed; reduced in place.
  virtual void run_on(T* data) = 0;
};

// Every rank sends its whole buffer to every other rank in one round and sums the n buffers in
// rank order (r0 + r1 + ... + r(n-1)), so every rank computes the same bits: one message latency
// where gloo::AllreduceRing needs p - 1 rounds of a message and a notification and
// halving-doubling 2 log2(p). Each rank sends and receives (p - 1) x the buffer, so it is for
// small buffers.
//
// Flow control without notifications: the inboxes alternate between two slots, one per parity
// of the call. A rank that sends call k + 2 into a peer's inbox of call k has received that
// peer's call k + 1 message, which the peer sent only after it had summed call k: the inbox is
// free. The outbox is this rank's region of the same buffer, sent before the call returns.
template <typename T>
class DirectExchange : public CallerBufferAlgorithm<T> {
  using CallerBufferAlgorithm<T>::contextRank_;
  using CallerBufferAlgorithm<T>::contextSize_;
  using CallerBufferAlgorithm<T>::getPair;

 public:
  // count elements per call; op is sum, min or max (kAvg divides afterwards).
  DirectExchange(const std::shared_ptr<gloo::Context>& context, size_t count,
                 const gloo::ReductionFunction<T>* fn)
      : CallerBufferAlgorithm<T>(context), count_(count), fn_(fn) {
    const size_t n = static_cast<size_t>(contextSize_);
    const size_t bytes = count_ * sizeof(T);
    for (Round& round : rounds_) {
      round.regions.resize(n * count_);  // (n, count): region r holds rank r's buffer
      round.send.resize(n);
      round.recv.resize(n);
      const int slot = context->nextSlot();
      T* mine = round.regions.data() + static_cast<size_t>(contextRank_) * count_;
      for (int r = 0; r < contextSize_; ++r) {
        if (r == contextRank_) continue;
        T* theirs = round.regions.data() + static_cast<size_t>(r) * count_;
        round.recv[static_cast<size_t>(r)] = getPair(r)->createRecvBuffer(slot, theirs, bytes);
        round.send[static_cast<size_t>(r)] = getPair(r)->createSendBuffer(slot, mine, bytes);
      }
    }
  }

  void run_on(T* data) override {
    Round& round = rounds_[parity_];
    parity_ ^= 1;
    T* regions = round.regions.data();
    std::copy(data, data + count_, regions + static_cast<size_t>(contextRank_) * count_);
    // Send this rank's buffer to every peer, then wait for theirs.
    for (auto& send : round.send) {
      if (send) send->send();
    }
    for (auto& recv : round.recv) {
      if (recv) recv->waitRecv();
    }
    // Sum in rank order, the same on every rank.
    std::copy(regions, regions + count_, data);
    for (int r = 1; r < contextSize_; ++r) {
      fn_->call(data, regions + static_cast<size_t>(r) * count_, count_);
    }
    // The outbox is reused two calls later: the sends must have left it.
    for (auto& send : round.send) {
      if (send) send->waitSend();
    }
  }

 private:
  struct Round {
    std::vector<T> regions;
    std::vector<std::unique_ptr<gloo::transport::Buffer>> send;  // by peer rank; own empty
    std::vector<std::unique_ptr<gloo::transport::Buffer>> recv;  // by peer rank; own empty
  };
  const size_t count_;
  const gloo::ReductionFunction<T>* const fn_;
  Round rounds_[2];
  int parity_ = 0;
};

// Reduce-scatter and allgather, each in one step: rank j sums chunk j of every rank's buffer in
// rank order and sends the sum to every other rank. Every rank holds the same bits; each sends
// 2 (p - 1) / p x the buffer, as halving-doubling does, in 2 steps where halving-doubling takes
// 2 log2(p), each followed by a notification. For buffers too large for DirectExchange.
//
// Flow control as in DirectExchange: both steps' inboxes alternate between two sets by the
// parity of the call. A rank that writes a peer's reduce-scatter inbox of call k + 2 has
// received that peer's sum of call k + 1, which the peer computed after it had finished call k;
// one that writes a peer's allgather inbox of call k + 2 has received the peer's call k + 2
// chunk, sent after the peer had copied out call k + 1.
template <typename T>
class DirectScatterGather : public CallerBufferAlgorithm<T> {
  using CallerBufferAlgorithm<T>::contextRank_;
  using CallerBufferAlgorithm<T>::contextSize_;
  using CallerBufferAlgorithm<T>::getPair;

 public:
  // count elements per call; op is sum, min or max (kAvg divides afterwards).
  DirectScatterGather(const std::shared_ptr<gloo::Context>& context, size_t count,
                      const gloo::ReductionFunction<T>* fn)
      : CallerBufferAlgorithm<T>(context),
        count_(count),
        chunk_((count + static_cast<size_t>(contextSize_) - 1) / static_cast<size_t>(contextSize_)),
        fn_(fn) {
    const size_t n = static_cast<size_t>(contextSize_);
    const size_t me = static_cast<size_t>(contextRank_);
    for (Round& round : rounds_) {
      round.outbox.resize(n * chunk_);   // this rank's buffer, padded to n chunks
      round.scatter.resize(n * chunk_);  // (n, chunk): row r is rank r's chunk `me`
      round.gather.resize(n * chunk_);   // (n, chunk): row r is the sum of chunk r
      for (auto* buffers : {&round.to_owner, &round.from_peer, &round.sum_out, &round.sum_in}) {
        buffers->resize(n);
      }
      const int scatter_slot = context->nextSlot();
      const int gather_slot = context->nextSlot();
      for (size_t r = 0; r < n; ++r) {
        if (r == me) continue;
        auto& pair = getPair(static_cast<int>(r));
        // Chunk r of this rank goes to rank r's scatter row `me`.
        if (length(r) > 0) {
          round.to_owner[r] = pair->createSendBuffer(scatter_slot, round.outbox.data() + r * chunk_,
                                                     length(r) * sizeof(T));
        }
        if (length(me) > 0) {
          round.from_peer[r] = pair->createRecvBuffer(
              scatter_slot, round.scatter.data() + r * chunk_, length(me) * sizeof(T));
          // The sum of chunk `me` goes to every rank's gather row `me`.
          round.sum_out[r] = pair->createSendBuffer(gather_slot, round.gather.data() + me * chunk_,
                                                    length(me) * sizeof(T));
        }
        if (length(r) > 0) {
          round.sum_in[r] = pair->createRecvBuffer(gather_slot, round.gather.data() + r * chunk_,
                                                   length(r) * sizeof(T));
        }
      }
    }
  }

  void run_on(T* data) override {
    const size_t n = static_cast<size_t>(contextSize_);
    const size_t me = static_cast<size_t>(contextRank_);
    Round& round = rounds_[parity_];
    parity_ ^= 1;
    std::copy(data, data + count_, round.outbox.data());
    // Reduce-scatter: chunk r to rank r, then the chunks `me` of every peer.
    for (auto& send : round.to_owner) {
      if (send) send->send();
    }
    for (auto& recv : round.from_peer) {
      if (recv) recv->waitRecv();
    }
    // Sum chunk `me` in rank order into this rank's gather row.
    const size_t mine = length(me);
    T* sum = round.gather.data() + me * chunk_;
    const T* own = round.outbox.data() + me * chunk_;
    for (size_t r = 0; r < n; ++r) {
      const T* part = r == me ? own : round.scatter.data() + r * chunk_;
      if (r == 0) {
        std::copy(part, part + mine, sum);
      } else {
        fn_->call(sum, part, mine);
      }
    }
    // Allgather: the sum to every peer, then the peers' sums.
    for (auto& send : round.sum_out) {
      if (send) send->send();
    }
    for (auto& recv : round.sum_in) {
      if (recv) recv->waitRecv();
    }
    std::copy(round.gather.data(), round.gather.data() + count_, data);
    // The outbox and the sum are reused two calls later: the sends must have left them.
    for (auto* sends : {&round.to_owner, &round.sum_out}) {
      for (auto& send : *sends) {
        if (send) send->waitSend();
      }
    }
  }

 private:
  // Elements of chunk r (the last chunks may be short or empty).
  size_t length(size_t r) const {
    const size_t begin = std::min(r * chunk_, count_);
    return std::min(begin + chunk_, count_) - begin;
  }

  struct Round {
    std::vector<T> outbox, scatter, gather;
    // By peer rank, this rank's own empty: chunk r to rank r; rank r's chunk `me`; this rank's
    // sum to rank r; rank r's sum.
    std::vector<std::unique_ptr<gloo::transport::Buffer>> to_owner, from_peer, sum_out, sum_in;
  };
  const size_t count_;
  const size_t chunk_;
  const gloo::ReductionFunction<T>* const fn_;
  Round rounds_[2];
  int parity_ = 0;
};

}  // namespace hsgd::detail
