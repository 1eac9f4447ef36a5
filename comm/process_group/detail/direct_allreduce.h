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
// The messages go out of the caller's buffer (its chunk r to rank r, then its sum of chunk `me`
// to every peer), so only what comes in is copied: the sums of the other chunks, from the
// inboxes into the caller's buffer. A send buffer is made for each call, since the caller's
// buffer may move. Destroying any buffer of a Gloo pair, a send buffer too, unregisters that
// buffer's slot on the pair, so messages to higher ranks and to lower ranks take different
// slots, and no pair sends on a slot that it has registered for receiving.
//
// Flow control without notifications: both steps' inboxes alternate between two sets by the
// parity of the call. A rank that writes a peer's reduce-scatter inbox of call k + 2 has
// received that peer's sum of call k + 1, which the peer computed after it had finished call k;
// one that writes a peer's allgather inbox of call k + 2 has received the peer's call k + 2
// chunk, sent after the peer had finished call k + 1. A peer's sum of chunk r comes after that
// peer received this rank's chunk r in full, so chunk r has left the caller's buffer before it
// is overwritten.
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
        fn_(fn),
        sum_(chunk_) {
    const size_t n = static_cast<size_t>(contextSize_);
    const size_t me = static_cast<size_t>(contextRank_);
    for (Round& round : rounds_) {
      round.scatter.resize(n * chunk_);  // (n, chunk): row r is rank r's chunk `me`
      round.gather.resize(n * chunk_);   // (n, chunk): row r is rank r's sum of chunk r
      round.from_peer.resize(n);
      round.sum_in.resize(n);
      for (Step* step : {&round.scatter_slots, &round.gather_slots}) {
        step->to_higher = context->nextSlot();
        step->to_lower = context->nextSlot();
      }
      for (size_t r = 0; r < n; ++r) {
        if (r == me) continue;
        auto& pair = getPair(static_cast<int>(r));
        if (length(me) > 0) {
          round.from_peer[r] =
              pair->createRecvBuffer(round.scatter_slots.from(r, me),
                                     round.scatter.data() + r * chunk_, length(me) * sizeof(T));
        }
        if (length(r) > 0) {
          round.sum_in[r] =
              pair->createRecvBuffer(round.gather_slots.from(r, me),
                                     round.gather.data() + r * chunk_, length(r) * sizeof(T));
        }
      }
    }
  }

  void run_on(T* data) override {
    const size_t n = static_cast<size_t>(contextSize_);
    const size_t me = static_cast<size_t>(contextRank_);
    const size_t mine = length(me);
    Round& round = rounds_[parity_];
    parity_ ^= 1;
    // Reduce-scatter: chunk r to rank r, then the chunks `me` of every peer. Both steps send to
    // me + 1, me + 2, ...: the ranks' d-th messages go to n different receivers, where in rank
    // order all would go to rank 0 first and the last rank would get its chunks last.
    std::vector<std::unique_ptr<gloo::transport::Buffer>> to_owner(n), sum_out(n);
    try {
      for (size_t d = 1; d < n; ++d) {
        const size_t r = (me + d) % n;
        if (length(r) == 0) continue;
        to_owner[r] = getPair(static_cast<int>(r))
                          ->createSendBuffer(round.scatter_slots.to(r, me), data + r * chunk_,
                                             length(r) * sizeof(T));
        to_owner[r]->send();
      }
      for (auto& recv : round.from_peer) {
        if (recv) recv->waitRecv();
      }
      if (mine > 0) {
        // Chunk `me` summed in rank order, then written over this rank's own part.
        T* own = data + me * chunk_;
        const auto part = [&](size_t r) {
          return r == me ? own : round.scatter.data() + r * chunk_;
        };
        std::copy(part(0), part(0) + mine, sum_.data());
        for (size_t r = 1; r < n; ++r) fn_->call(sum_.data(), part(r), mine);
        std::copy(sum_.data(), sum_.data() + mine, own);
        // Allgather: the sum to every peer, then the peers' sums.
        for (size_t d = 1; d < n; ++d) {
          const size_t r = (me + d) % n;
          sum_out[r] = getPair(static_cast<int>(r))
                           ->createSendBuffer(round.gather_slots.to(r, me), own, mine * sizeof(T));
          sum_out[r]->send();
        }
      }
      for (size_t r = 0; r < n; ++r) {
        if (!round.sum_in[r]) continue;
        round.sum_in[r]->waitRecv();
        const T* sum = round.gather.data() + r * chunk_;
        std::copy(sum, sum + length(r), data + r * chunk_);
      }
      // The messages must have left the caller's buffer before the call returns.
      for (auto* sends : {&to_owner, &sum_out}) {
        for (auto& send : *sends) {
          if (send) send->waitSend();
        }
      }
    } catch (...) {
      // A pair still refers to a send buffer whose message it has not finished (it reports the
      // failure to it when it closes): such buffers live as long as the algorithm. Until the
      // group's connections close, such a send may still read the caller's buffer, as Gloo's
      // ring on the caller's memory may; nothing is written into it after the call.
      for (auto* sends : {&to_owner, &sum_out}) {
        for (auto& send : *sends) {
          if (send) abandoned_.push_back(std::move(send));
        }
      }
      throw;
    }
  }

 private:
  // Elements of chunk r (the last chunks may be short or empty).
  size_t length(size_t r) const {
    const size_t begin = std::min(r * chunk_, count_);
    return std::min(begin + chunk_, count_) - begin;
  }

  // The two slots of one step: messages to a higher rank and to a lower one.
  struct Step {
    int to_higher = 0;
    int to_lower = 0;
    // The slot of a message from this rank `me` to rank r, and of one from rank r to `me`.
    int to(size_t r, size_t me) const { return r > me ? to_higher : to_lower; }
    int from(size_t r, size_t me) const { return r < me ? to_higher : to_lower; }
  };
  struct Round {
    std::vector<T> scatter, gather;
    Step scatter_slots, gather_slots;
    // By peer rank, this rank's own empty: rank r's chunk `me`; rank r's sum.
    std::vector<std::unique_ptr<gloo::transport::Buffer>> from_peer, sum_in;
  };
  const size_t count_;
  const size_t chunk_;
  const gloo::ReductionFunction<T>* const fn_;
  std::vector<T> sum_;  // (chunk,): this rank's sum in rank order
  Round rounds_[2];
  int parity_ = 0;
  std::vector<std::unique_ptr<gloo::transport::Buffer>> abandoned_;  // sends of failed calls
};

}  // namespace hsgd::detail
