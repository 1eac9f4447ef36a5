#include "comm/launcher/output_router.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "comm/error.h"
#include "tests/support/multiprocess.h"

namespace hsgd::comm::launcher {
namespace {

using std::chrono::milliseconds;

struct Pipe {
  int r = -1, w = -1;
  Pipe() {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    r = fds[0];
    w = fds[1];
  }
  void write(const std::string& s) const {
    EXPECT_EQ(::write(w, s.data(), s.size()), (ssize_t)s.size());
  }
  void close_write() {
    ::close(w);
    w = -1;
  }
};

std::string read_available(int fd) {
  ::fcntl(fd, F_SETFL, O_NONBLOCK);
  std::string out;
  char buf[1024];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

TEST(OutputRouterTest, PrefixesLinesPerRankAndStream) {
  Pipe term_out, term_err, worker_out, worker_err;
  {
    OutputRouter router(OutputOptions{.stdout_fd = term_out.w, .stderr_fd = term_err.w}, 0);
    router.add(3, worker_out.r, OutputRouter::Stream::kStdout);
    router.add(3, worker_err.r, OutputRouter::Stream::kStderr);
    worker_out.write("hello\npart");
    worker_err.write("oops\n");
    worker_out.write("ial\nno newline at end");
    worker_out.close_write();
    worker_err.close_write();
    router.drain(milliseconds(5000));
  }
  EXPECT_EQ(read_available(term_out.r),
            "[rank 3] hello\n[rank 3] partial\n[rank 3] no newline at end\n");
  EXPECT_EQ(read_available(term_err.r), "[rank 3] oops\n");
}

TEST(OutputRouterTest, KeepsTheLastLines) {
  Pipe term, worker;
  OutputRouter router(OutputOptions{.stdout_fd = term.w, .stderr_fd = term.w, .tail_lines = 2}, 0);
  router.add(0, worker.r, OutputRouter::Stream::kStdout);
  worker.write("a\nb\nc\n");
  worker.close_write();
  router.drain(milliseconds(5000));
  EXPECT_EQ(router.tail(0), (std::vector<std::string>{"b", "c"}));
  EXPECT_TRUE(router.tail(1).empty());
}

TEST(OutputRouterTest, LogDir_OneFilePerRank) {
  const auto dir = hsgd::testing::unique_temp_dir("output_router");
  Pipe term, a, b;
  {
    OutputRouter router(
        OutputOptions{.stdout_fd = term.w, .stderr_fd = term.w, .log_dir = dir.string()}, 2);
    router.add(0, a.r, OutputRouter::Stream::kStdout);
    router.add(1, b.r, OutputRouter::Stream::kStderr);
    EXPECT_EQ(router.log_path(1), dir.string() + "/attempt_2/rank_1.log");
    a.write("from zero\n");
    b.write("from one\n");
    a.close_write();
    b.close_write();
    router.drain(milliseconds(5000));
  }
  auto slurp = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  EXPECT_EQ(slurp(dir.string() + "/attempt_2/rank_0.log"), "from zero\n");
  EXPECT_EQ(slurp(dir.string() + "/attempt_2/rank_1.log"), "from one\n");
  EXPECT_EQ(read_available(term.r), "") << "log-dir mode must not write to the terminal";
}

TEST(OutputRouterTest, UnwritableLogDir_ThrowsNamingIt) {
  try {
    OutputRouter router(OutputOptions{.log_dir = "/proc/hsgd-no-such-dir"}, 0);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/hsgd-no-such-dir"), std::string::npos) << e.what();
  }
}

// When hsgd-run stops the workers their last lines arrive all at once; a
// non-blocking terminal pipe with a slow reader (EAGAIN) must not make the router drop them.
TEST(OutputRouterTest, NonBlockingSlowTerminal_NoLineLost) {
  Pipe term, worker;
  ASSERT_EQ(::fcntl(term.w, F_SETFL, O_NONBLOCK), 0);
  ::fcntl(term.w, F_SETPIPE_SZ, 4096);  // the smallest pipe: EAGAIN comes early
  constexpr int kLines = 3000;
  std::thread writer([&] {
    for (int i = 0; i < kLines; ++i) worker.write("line " + std::to_string(i) + " of the worker\n");
    worker.close_write();
  });
  std::string received;
  std::thread reader([&] {
    char buf[512];
    ssize_t n;
    while ((n = ::read(term.r, buf, sizeof(buf))) > 0) {
      received.append(buf, static_cast<size_t>(n));
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // a slow terminal
    }
  });
  {
    OutputRouter router(OutputOptions{.stdout_fd = term.w}, 0);
    router.add(0, worker.r, OutputRouter::Stream::kStdout);
    router.drain(milliseconds(60000));
  }
  writer.join();
  term.close_write();
  reader.join();
  std::istringstream lines(received);
  std::string line;
  int count = 0;
  while (std::getline(lines, line)) {
    ASSERT_EQ(line, "[rank 0] line " + std::to_string(count) + " of the worker")
        << "line " << count;
    ++count;
  }
  EXPECT_EQ(count, kLines);
}

}  // namespace
}  // namespace hsgd::comm::launcher
