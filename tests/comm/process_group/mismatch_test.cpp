// Ranks in different collectives are found within seconds (ProcessGroup::Options::
// mismatch_check, comm/process_group/detail/collective_watchdog.h), not at the group's timeout:
// every rank fails with CollectiveMismatch naming what each rank is in, the root cause first.
// The groups here have a 120 s timeout, so an error that arrives within 30 s can only come from
// the mismatch check (the default threshold is 2 s; the bound is loose for a loaded machine).

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "comm/error.h"
#include "comm/process_group/detail/gloo_abort.h"
#include "comm/process_group/process_group.h"
#include "comm/store/file_store.h"
#include "tests/support/error_message.h"
#include "tests/support/log_capture.h"
#include "tests/support/multiprocess.h"
#include "tests/support/world.h"

namespace hsgd::comm {
namespace {

using hsgd::testing::error_message;
using hsgd::testing::run_world;
using hsgd::testing::WorldOptions;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr auto kLongTimeout = std::chrono::seconds(120);
constexpr double kMuchSoonerSeconds = 30.0;

WorldOptions long_timeout(bool shm) {
  WorldOptions options;
  options.timeout = kLongTimeout;
  options.deadline = std::chrono::seconds(100);  // a rank left waiting is killed before ctest's
  options.shared_memory = shm;
  return options;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// What the others see of rank `rank`'s message: each rank stores it, rank 0 compares.
void expect_same_message_everywhere(ProcessGroup& pg, const std::string& message) {
  auto store = pg.store();
  store->set("message/" + std::to_string(pg.rank()), to_bytes(message));
  if (pg.rank() != 0) return;
  for (int r = 1; r < pg.size(); ++r) {
    const std::string theirs =
        to_string(store->get("message/" + std::to_string(r), std::chrono::seconds(60)));
    // The part after "failed: " is the report, the same on every rank.
    const auto report = [](const std::string& m) { return m.substr(m.find("failed: ")); };
    EXPECT_EQ(report(theirs), report(message)) << "rank " << r;
  }
}

// The example: rank 0 reports a metric alone while the others broadcast DDP's buffers.
TEST(CollectiveMismatchTest, OneRankInAnotherCollective_EveryRankFailsWithinSeconds) {
  for (const bool shm : {true, false}) {
    auto result = run_world(4, long_timeout(shm), [&](int rank, const auto& pg) {
      std::vector<float> x(16, 1.0f);
      pg->allreduce(std::span<float>(x))->wait();  // #0 matches everywhere
      std::vector<float> metric(1, 1.0f);
      std::vector<float> buffers(98, 1.0f);
      const auto start = Clock::now();
      std::vector<int> same;
      const std::string message = error_message<CollectiveMismatch>([&] {
        try {
          if (rank == 0) {
            pg->allreduce(std::span<float>(metric), ReduceOp::kSum, "rank0 only metric")->wait();
          } else {
            pg->broadcast(std::span<float>(buffers), 0, "DDP buffers")->wait();
          }
        } catch (const CollectiveMismatch& e) {
          same = e.same_ranks();
          throw;
        }
      });
      EXPECT_LT(seconds_since(start), kMuchSoonerSeconds) << "rank " << rank << " shm " << shm;
      EXPECT_THAT(message, HasSubstr("allreduce (1 x float, sum) #1 'rank0 only metric' was "
                                     "called on rank 0 only; ranks 1-3 are in broadcast (98 x "
                                     "float, root 0) #1 'DDP buffers'"))
          << "rank " << rank << " shm " << shm;
      if (rank == 0) {
        EXPECT_THAT(same, ElementsAre(0));
      } else {
        EXPECT_THAT(same, ElementsAre(1, 2, 3)) << "rank " << rank;
      }
      expect_same_message_everywhere(*pg, message);
      // The group is broken: later collectives fail at once.
      EXPECT_THROW(pg->allreduce(std::span<float>(x))->wait(), CommError);
    });
    EXPECT_RANKS_OK(result);
  }
}

// The others' collective is the group's first large transfer after a pinned allreduce, so they
// size the pairs' send buffers first (an exchange of pinned messages); no pinned message of it
// may reach rank 0, which is in another collective and would then read nothing else.
// Plain TCP: only Gloo's TCP pairs have their send buffers sized.
TEST(CollectiveMismatchTest, AnotherCollectiveWhileTheOthersSizeSendBuffers_FailsWithinSeconds) {
  WorldOptions options = long_timeout(false);
  options.insecure = true;
  auto result = run_world(3, options, [&](int rank, const auto& pg) {
    std::vector<float> x(16, 1.0f);
    pg->allreduce(std::span<float>(x))->wait();  // pinned, 64 bytes: no sizing yet
    std::vector<float> metric(1, 1.0f);
    std::vector<float> buffers(100000, 1.0f);
    const auto start = Clock::now();
    const std::string message = error_message<CollectiveMismatch>([&] {
      if (rank == 0) {
        pg->allreduce(std::span<float>(metric), ReduceOp::kSum, "rank0 only metric")->wait();
      } else {
        pg->broadcast(std::span<float>(buffers), 1, "large buffers")->wait();
      }
    });
    EXPECT_LT(seconds_since(start), kMuchSoonerSeconds) << "rank " << rank;
    EXPECT_THAT(message, HasSubstr("'rank0 only metric' was called on rank 0 only"))
        << "rank " << rank;
  });
  EXPECT_RANKS_OK(result);
}

// The same with the collectives run on the calling threads (RunOn::kCaller): the watchdog sees
// them and aborts the transport under them as under the worker; the call returns the failed Work.
TEST(CollectiveMismatchTest, RunOnCaller_EveryRankFailsWithinSeconds) {
  for (const bool shm : {true, false}) {
    auto result = run_world(3, long_timeout(shm), [&](int rank, const auto& pg) {
      std::vector<float> x(16, 1.0f);
      pg->allreduce(std::span<float>(x), ReduceOp::kSum, {}, RunOn::kCaller)->wait();
      std::vector<float> metric(1, 1.0f);
      std::vector<float> buffers(98, 1.0f);
      const auto start = Clock::now();
      std::shared_ptr<Work> work =
          rank == 0 ? pg->allreduce(std::span<float>(metric), ReduceOp::kSum, "rank0 only metric",
                                    RunOn::kCaller)
                    : pg->broadcast(std::span<float>(buffers), 0, "DDP buffers", RunOn::kCaller);
      EXPECT_TRUE(work->is_completed()) << "rank " << rank;
      const std::string message = error_message<CollectiveMismatch>([&] { work->wait(); });
      EXPECT_LT(seconds_since(start), kMuchSoonerSeconds) << "rank " << rank << " shm " << shm;
      EXPECT_THAT(message, HasSubstr("allreduce (1 x float, sum) #1 'rank0 only metric' was "
                                     "called on rank 0 only; ranks 1, 2 are in broadcast (98 x "
                                     "float, root 0) #1 'DDP buffers'"))
          << "rank " << rank << " shm " << shm;
      EXPECT_THROW(pg->allreduce(std::span<float>(x), ReduceOp::kSum, {}, RunOn::kCaller)->wait(),
                   CommError);
    });
    EXPECT_RANKS_OK(result);
  }
}

// Two against two: the root cause is the set with the lowest rank, on every rank and every run.
TEST(CollectiveMismatchTest, EvenSplit_TheRootCauseIsTheSameInEveryRun) {
  for (int run = 0; run < 2; ++run) {
    auto result = run_world(4, long_timeout(false), [&](int rank, const auto& pg) {
      const std::string message = error_message<CollectiveMismatch>(
          [&] { pg->named_barrier(rank < 2 ? "evaluate" : "train step")->wait(); });
      EXPECT_THAT(message, HasSubstr("barrier #0 'evaluate' was called on ranks 0, 1 only; "
                                     "ranks 2, 3 are in barrier #0 'train step'"))
          << "rank " << rank << " run " << run;
      expect_same_message_everywhere(*pg, message);
    });
    EXPECT_RANKS_OK(result);
  }
}

// Different sequence numbers: rank 1 issued one collective more (an empty broadcast completes
// locally), so its barrier is #1 while the others' is #0. (A cached Gloo allreduce of one shape
// would simply match across sequence numbers; a barrier's tag carries its number.)
TEST(CollectiveMismatchTest, DifferentSequenceNumbers_AreAMismatch) {
  auto result = run_world(3, long_timeout(false), [&](int rank, const auto& pg) {
    std::vector<float> empty;
    if (rank == 1) pg->broadcast(std::span<float>(empty), 1, "extra")->wait();
    const auto start = Clock::now();
    const std::string message =
        error_message<CollectiveMismatch>([&] { pg->barrier("sync")->wait(); });
    EXPECT_LT(seconds_since(start), kMuchSoonerSeconds) << "rank " << rank;
    EXPECT_THAT(message, HasSubstr("barrier #1 'sync' was called on rank 1 only; ranks 0, 2 are "
                                   "in barrier #0 'sync'"))
        << "rank " << rank;
  });
  EXPECT_RANKS_OK(result);
}

// The others have left the group (shutdown) while rank 0 still calls a collective: rank 0 fails
// within seconds, and so do the others, whose shutdown waits for rank 0.
TEST(CollectiveMismatchTest, OthersLeftTheGroup_FailsWithinSecondsEverywhere) {
  auto result = run_world(3, long_timeout(true), [&](int rank, const auto& pg) {
    std::vector<float> x(4, 1.0f);
    pg->allreduce(std::span<float>(x))->wait();
    const auto start = Clock::now();
    const std::string message = error_message<CollectiveMismatch>([&] {
      if (rank == 0) {
        pg->barrier("final metrics")->wait();
      } else {
        pg->shutdown(std::chrono::seconds(90));
      }
    });
    EXPECT_LT(seconds_since(start), kMuchSoonerSeconds) << "rank " << rank;
    EXPECT_THAT(message, HasSubstr("barrier #1 'final metrics' was called on rank 0 only; ranks "
                                   "1, 2 have left the group (ProcessGroup::shutdown)"))
        << "rank " << rank;
    if (rank != 0) {
      EXPECT_THAT(message, HasSubstr("ProcessGroup::shutdown of group 'world' (rank " +
                                     std::to_string(rank) + " of 3): another member waits"));
    }
  });
  EXPECT_RANKS_OK(result);
}

// A slow rank is not a mismatch: the others wait past the threshold, then all complete.
TEST(CollectiveMismatchTest, SlowRank_IsNotAMismatch) {
  auto result = run_world(3, long_timeout(false), [&](int rank, const auto& pg) {
    for (int i = 0; i < 2; ++i) {
      if (rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(5000));
      std::vector<float> x(8, static_cast<float>(rank));
      pg->allreduce(std::span<float>(x), ReduceOp::kSum, "slow")->wait();
      EXPECT_EQ(x[0], 3.0f) << "rank " << rank << " round " << i;
    }
  });
  EXPECT_RANKS_OK(result);
}

// A collective that waits long for a member that publishes nothing (here: it sleeps; a lost link
// looks the same) names it in a warning long before the timeout, and the ranks that wait too.
TEST(CollectiveMismatchTest, LongWait_NamesTheMembersThatPublishedNothing) {
  auto result = run_world(3, long_timeout(false), [&](int rank, const auto& pg) {
    hsgd::testing::LogCapture log;
    if (rank == 2) std::this_thread::sleep_for(std::chrono::seconds(12));
    std::vector<float> x(8, 1.0f);
    pg->allreduce(std::span<float>(x), ReduceOp::kSum, "waits for rank 2")->wait();
    EXPECT_EQ(x[0], 3.0f);
    if (rank == 2) return;
    EXPECT_THAT(log.text(), HasSubstr("'waits for rank 2' has waited"));
    EXPECT_THAT(log.text(),
                HasSubstr("rank 2 published no collective of this group (computing, waiting "
                          "elsewhere, or unreachable: a lost link or host); ranks 0, 1 are in it"));
  });
  EXPECT_RANKS_OK(result);
}

// Subgroups are checked on their own (their own store prefix): a mismatch in one pair of ranks
// is found while the other pair's subgroup works.
TEST(CollectiveMismatchTest, Subgroup_MismatchIsFoundInThatSubgroup) {
  auto result = run_world(4, long_timeout(false), [&](int rank, const auto& pg) {
    auto [pair, all_pairs] = new_subgroups(pg, 2);
    std::vector<float> x(4, 1.0f);
    if (rank < 2) {
      pair->allreduce(std::span<float>(x))->wait();
      EXPECT_EQ(x[0], 2.0f);
      // `pair` is destroyed when the body returns, before run_world's leave_together: its members
      // meet first. Otherwise rank 0 can close the pair's connections while rank 1's allreduce
      // has received its last message but not yet taken it, and Gloo fails that allreduce
      // ("Connection closed by peer": a closed pair fails its buffers' pending waits).
      pair->shutdown(std::chrono::seconds(30));
      return;
    }
    const std::string message = error_message<CollectiveMismatch>(
        [&] { pair->named_barrier(rank == 2 ? "save" : "load")->wait(); });
    EXPECT_THAT(message, HasSubstr("the ranks of group 'world/"));
    EXPECT_THAT(message, HasSubstr("barrier #0 'save' was called on rank 0 only; rank 1 is in "
                                   "barrier #0 'load'"))
        << "rank " << rank;
  });
  EXPECT_RANKS_OK(result);
}

// A FileStore that counts the watchdog's writes (keys with "waiting/").
class CountingStore : public FileStore {
 public:
  using FileStore::FileStore;
  void set(const std::string& key, const Bytes& value) override {
    if (key.find("waiting/") != std::string::npos) ++published;
    FileStore::set(key, value);
  }
  std::atomic<int> published{0};
};

// The fast path costs no store traffic: collectives that complete within the threshold publish
// nothing; one that waits past it (a rank sleeps 4 s) publishes once, and still completes.
TEST(CollectiveMismatchTest, FastCollectivesWriteNothingToTheStore) {
  const auto dir = hsgd::testing::unique_temp_dir("fast_path");
  auto result = hsgd::testing::run_ranks(3, std::chrono::seconds(90), [&](int rank) {
    auto store = std::make_shared<CountingStore>(dir);
    auto pg = init_process_group({.rank = rank,
                                  .world_size = 3,
                                  .store = store,
                                  .token = "test-token",
                                  .timeout = std::chrono::seconds(60),
                                  .shared_memory = false});
    std::vector<float> x(64, 1.0f);
    for (int i = 0; i < 200; ++i) {
      pg->allreduce(std::span<float>(x), ReduceOp::kMax)->wait();
      if (i % 10 == 0) pg->barrier()->wait();
    }
    EXPECT_EQ(store->published.load(), 0) << "rank " << rank;
    if (rank == 2) std::this_thread::sleep_for(std::chrono::seconds(4));
    pg->allreduce(std::span<float>(x), ReduceOp::kSum, "after a slow rank")->wait();
    EXPECT_EQ(x[0], 3.0f) << "rank " << rank;
    if (rank == 0) {
      EXPECT_EQ(store->published.load(), 1);  // waited ~4 s past a 2 s threshold
    }
    pg->shutdown(std::chrono::seconds(30));
  });
  EXPECT_RANKS_OK(result);
  std::filesystem::remove_all(dir);
}

// A socket closed at the end of the scope.
struct Socket {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  Socket() = default;
  explicit Socket(int accepted) : fd(accepted) {}
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() {
    if (fd >= 0) ::close(fd);
  }
};

sockaddr_in loopback(uint16_t port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return address;
}

sockaddr_in local_address(int fd) {
  sockaddr_in address{};
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  return address;
}

// recv of one byte once fd is readable, within 5 s (-2 when it is not).
ssize_t recv_within_seconds(int fd, char& byte) {
  pollfd readable{.fd = fd, .events = POLLIN, .revents = 0};
  if (::poll(&readable, 1, 5000) != 1) return -2;
  return ::recv(fd, &byte, 1, MSG_DONTWAIT);
}

hsgd::detail::SocketEnds ends_of(int fd) {
  hsgd::detail::SocketEnds ends;
  socklen_t length = sizeof(ends.local);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ends.local), &length);
  length = sizeof(ends.peer);
  ::getpeername(fd, reinterpret_cast<sockaddr*>(&ends.peer), &length);
  return ends;
}

// The abort of a group shuts down that group's connections only. The connecting sides of two
// connections to different peers may have the same local address (the kernel hands the same
// ephemeral port to connections whose peers differ; here both bind it explicitly): each group
// of a process has its own connections, and one group's abort must leave the others working.
TEST(GlooAbortTest, SharedLocalAddress_OnlyTheListedConnectionIsShutDown) {
  Socket listeners[2];
  for (Socket& listener : listeners) {
    const sockaddr_in any_port = loopback(0);
    ASSERT_EQ(::bind(listener.fd, reinterpret_cast<const sockaddr*>(&any_port), sizeof(any_port)),
              0)
        << std::strerror(errno);
    ASSERT_EQ(::listen(listener.fd, 1), 0) << std::strerror(errno);
  }
  Socket clients[2];
  uint16_t shared_port = 0;
  for (int i = 0; i < 2; ++i) {
    const int on = 1;
    ASSERT_EQ(::setsockopt(clients[i].fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)), 0);
    const sockaddr_in local = loopback(shared_port);
    ASSERT_EQ(::bind(clients[i].fd, reinterpret_cast<const sockaddr*>(&local), sizeof(local)), 0)
        << "client " << i << ": " << std::strerror(errno);
    shared_port = ntohs(local_address(clients[i].fd).sin_port);
    const sockaddr_in server = local_address(listeners[i].fd);
    ASSERT_EQ(::connect(clients[i].fd, reinterpret_cast<const sockaddr*>(&server), sizeof(server)),
              0)
        << "client " << i << ": " << std::strerror(errno);
  }
  ASSERT_EQ(local_address(clients[0].fd).sin_port, local_address(clients[1].fd).sin_port);
  Socket servers[2] = {Socket(::accept(listeners[0].fd, nullptr, nullptr)),
                       Socket(::accept(listeners[1].fd, nullptr, nullptr))};
  ASSERT_GE(servers[0].fd, 0) << std::strerror(errno);
  ASSERT_GE(servers[1].fd, 0) << std::strerror(errno);

  EXPECT_EQ(hsgd::detail::shutdown_connections({ends_of(clients[0].fd)}), 1);

  // Connection 0 reads end-of-file on both ends; connection 1 still carries bytes.
  char byte = 0;
  EXPECT_EQ(recv_within_seconds(clients[0].fd, byte), 0);
  EXPECT_EQ(recv_within_seconds(servers[0].fd, byte), 0);
  EXPECT_EQ(::recv(clients[1].fd, &byte, 1, MSG_DONTWAIT), -1) << "connection 1 was shut down";
  EXPECT_EQ(errno, EAGAIN) << std::strerror(errno);
  ASSERT_EQ(::send(clients[1].fd, "x", 1, MSG_NOSIGNAL), 1) << std::strerror(errno);
  ASSERT_EQ(recv_within_seconds(servers[1].fd, byte), 1) << std::strerror(errno);
  EXPECT_EQ(byte, 'x');
}

}  // namespace
}  // namespace hsgd::comm
