#pragma once
// FailureRecord: what an agent publishes in the store when its part of the job fails, so that the
// agents on the other nodes stop their workers too and all report the same root cause.
//
// The first record written for an attempt wins (compare_set on an empty key): it is the root
// cause. kWorkerFailed allows a restart; kInterrupted (a signal to an agent), kFatal (e.g. the
// program cannot be executed), kPreempted (a worker exited kExitPreempted after a checkpoint) and
// kWillRepeat (a worker exited kExitWillRepeat: a restart would fail the same way; see
// comm/launcher/exit_codes.h) end the job on every node.
//
// Usage:
//   FailureRecord r{.kind = FailureRecord::Kind::kWorkerFailed, .node_rank = 0, .rank = 3,
//                   .message = "rank 3 ... exit code 1"};
//   store->compare_set("hsgd-run/attempt/0/failed", {}, comm::to_bytes(r.encode()));

#include <string>

namespace hsgd::comm::launcher {

struct FailureRecord {
  enum class Kind { kWorkerFailed, kInterrupted, kFatal, kPreempted, kWillRepeat };

  Kind kind = Kind::kWorkerFailed;
  int node_rank = -1;
  int rank = -1;          // global rank of the failed worker, -1 if not a worker failure
  int signal = 0;         // kInterrupted: the signal the agent received
  std::string message{};  // human-readable, already names rank, node, status and last lines

  bool restartable() const { return kind == Kind::kWorkerFailed; }

  std::string encode() const;
  // Throws hsgd::CommError on a malformed record.
  static FailureRecord decode(const std::string& text);
  // What an agent makes of the record found under attempt's failed key: decode(text), or, when
  // text is malformed (anything that can reach the job's keys may have written it), a
  // restartable failure of that attempt whose message quotes a short excerpt of text. Never
  // throws: a bad record fails the attempt, never the agent.
  static FailureRecord from_store(const std::string& text, int attempt);
};

}  // namespace hsgd::comm::launcher
