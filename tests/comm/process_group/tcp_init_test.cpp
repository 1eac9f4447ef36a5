// init_process_group without a store: like torch's env://, rank 0 hosts the rendezvous server on
// MASTER_PORT and every rank connects a TcpStore to it.

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/error.h"
#include "comm/process_group/process_group.h"
#include "tests/support/multiprocess.h"

namespace hsgd::comm {
namespace {

// A port that was free a moment ago (the kernel's pick for port 0).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    return 0;
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

TEST(TcpInitTest, RankZeroHostsTheServer_SubgroupsWork) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  auto result = hsgd::testing::run_ranks(4, std::chrono::seconds(60), [&](int rank) {
    auto world = init_process_group({.rank = rank,
                                     .world_size = 4,
                                     .master_addr = "127.0.0.1",
                                     .master_port = port,
                                     .job_id = "tcp-init-test",
                                     .token = "test-token",
                                     .timeout = std::chrono::seconds(30)});
    std::vector<float> x(5000, static_cast<float>(rank));
    world->allreduce(std::span<float>(x), ReduceOp::kSum)->wait();
    EXPECT_EQ(x[0], 6.0f);
    EXPECT_EQ(x[4999], 6.0f);
    auto [pair, pairs] = new_subgroups(world, 2);
    std::vector<double> y{static_cast<double>(rank)};
    pair->allreduce(std::span<double>(y), ReduceOp::kMax)->wait();
    EXPECT_EQ(y[0], static_cast<double>(rank | 1));
    // Rank 0 hosts the store: nobody may leave before everyone is done with it.
    pair->shutdown(std::chrono::seconds(30));
    world->shutdown(std::chrono::seconds(30));
    auto refused = world->barrier();
    EXPECT_THROW(refused->wait(), CommError);
  });
  EXPECT_RANKS_OK(result);
}

}  // namespace
}  // namespace hsgd::comm
