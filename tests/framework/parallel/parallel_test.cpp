// framework/parallel: the intra-op pool. Chunks cover the range once, in the documented fixed
// split, and dynamic pieces once, claimed by the free threads; errors, nesting, concurrent callers
// and fork are safe; the environment sets the count.

#include "framework/parallel/parallel.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <initializer_list>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/error.h"

namespace hsgd {
namespace {

// Restores the thread count a test changed.
class ParallelTest : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = get_num_threads(); }
  void TearDown() override { set_num_threads(saved_); }
  int saved_ = 1;
};

TEST_F(ParallelTest, ChunksCoverTheRangeExactlyOnce) {
  for (int threads : {1, 2, 3, 5}) {
    set_num_threads(threads);
    for (int64_t n : {0, 1, 2, 7, 100, 1001}) {
      for (int64_t grain : {1, 3, 64, 5000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n) + 10);
        std::atomic<int> chunks{0};
        parallel_for(10, 10 + n, grain, [&](int64_t lo, int64_t hi) {
          ++chunks;
          EXPECT_LT(lo, hi);
          for (int64_t i = lo; i < hi; ++i) ++hits[static_cast<size_t>(i - 10)];
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)], 1) << i;
        const int64_t expected = n == 0 ? 0 : std::min<int64_t>(threads, (n + grain - 1) / grain);
        EXPECT_EQ(chunks, expected) << "threads " << threads << " n " << n << " grain " << grain;
      }
    }
  }
}

TEST_F(ParallelTest, ChunkIRunsOnPoolThreadIWithTheDocumentedRange) {
  set_num_threads(3);
  std::mutex mu;
  std::map<int, std::pair<int64_t, int64_t>> by_index;
  std::set<std::thread::id> ids;
  parallel_for(0, 10, 1, [&](int64_t lo, int64_t hi) {
    std::lock_guard<std::mutex> lock(mu);
    by_index[parallel_thread_index()] = {lo, hi};
    ids.insert(std::this_thread::get_id());
  });
  ASSERT_EQ(by_index.size(), 3u);
  EXPECT_EQ(ids.size(), 3u);  // three distinct threads ran the three chunks
  for (int i = 0; i < 3; ++i) {
    int64_t lo = 0, hi = 0;
    detail::chunk_range(0, 10, 3, i, lo, hi);
    EXPECT_EQ(by_index[i], std::make_pair(lo, hi)) << "chunk " << i;
  }
  EXPECT_EQ(by_index[0].first, 0);
  EXPECT_EQ(by_index[2].second, 10);
  EXPECT_EQ(parallel_thread_index(), 0);  // outside parallel_for
}

// parallel_for_dynamic: pieces of grain indices cover the range once, each piece within one
// call of fn, run by as many threads as parallel_for's chunks, each seeing its own
// parallel_thread_index in [0, chunk_count).
TEST_F(ParallelTest, DynamicPiecesCoverTheRangeExactlyOnce) {
  for (int threads : {1, 2, 3, 5}) {
    set_num_threads(threads);
    for (int64_t n : {0, 1, 2, 7, 100, 1001}) {
      for (int64_t grain : {1, 3, 64, 5000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::mutex mu;
        std::set<int> indices;
        std::set<std::thread::id> ids;
        parallel_for_dynamic(10, 10 + n, grain, [&](int64_t lo, int64_t hi) {
          EXPECT_LT(lo, hi);
          {
            std::lock_guard<std::mutex> lock(mu);
            indices.insert(parallel_thread_index());
            ids.insert(std::this_thread::get_id());
          }
          for (int64_t i = lo; i < hi; ++i) ++hits[static_cast<size_t>(i - 10)];
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)], 1) << i;
        const int64_t count = detail::chunk_count(10, 10 + n, grain, threads);
        for (int index : indices) {
          EXPECT_GE(index, 0);
          EXPECT_LT(index, std::max<int64_t>(count, 1)) << "threads " << threads << " n " << n;
        }
        EXPECT_LE(static_cast<int64_t>(ids.size()), std::max<int64_t>(count, 1));
      }
    }
  }
}

// A thread that is slow takes fewer pieces: while the thread that claimed piece 0 sleeps, the
// other one claims the rest. (Static chunks would give each thread 20.)
TEST_F(ParallelTest, DynamicPiecesGoToTheThreadsThatAreFree) {
  set_num_threads(2);
  std::atomic<int> by_caller{0}, by_other{0};
  const auto caller = std::this_thread::get_id();
  parallel_for_dynamic(0, 40, 1, [&](int64_t lo, int64_t) {
    if (lo == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ++(std::this_thread::get_id() == caller ? by_caller : by_other);
  });
  EXPECT_EQ(by_caller + by_other, 40);
  EXPECT_GE(std::max(by_caller.load(), by_other.load()), 30)
      << "caller " << by_caller << ", pool thread " << by_other;
}

TEST_F(ParallelTest, DynamicExceptionIsRethrownAndThePoolStillWorks) {
  set_num_threads(2);
  EXPECT_THROW(parallel_for_dynamic(0, 50, 1,
                                    [&](int64_t lo, int64_t) {
                                      if (lo == 7) throw std::runtime_error("piece 7 failed");
                                    }),
               std::runtime_error);
  std::atomic<int64_t> sum{0};
  parallel_for_dynamic(0, 100, 3, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) sum += i;
  });
  EXPECT_EQ(sum, 4950);
}

TEST_F(ParallelTest, FirstExceptionIsRethrownAfterEveryChunkFinished) {
  set_num_threads(2);
  std::atomic<int> finished{0};
  try {
    parallel_for(0, 2, 1, [&](int64_t lo, int64_t) {
      if (lo == 1) {
        ++finished;
        throw std::runtime_error("chunk 1 failed");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ++finished;
    });
    FAIL() << "expected an exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "chunk 1 failed");
  }
  EXPECT_EQ(finished, 2);
  // The pool still works afterwards.
  std::atomic<int64_t> sum{0};
  parallel_for(0, 100, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) sum += i;
  });
  EXPECT_EQ(sum, 4950);
}

TEST_F(ParallelTest, NestedCallsRunSeriallyInTheCallingThread) {
  set_num_threads(2);
  std::atomic<int> inner_chunks{0};
  std::atomic<bool> same_thread{true};
  parallel_for(0, 2, 1, [&](int64_t, int64_t) {
    const auto outer = std::this_thread::get_id();
    const int index = parallel_thread_index();
    parallel_for(0, 1000, 1, [&](int64_t lo, int64_t hi) {
      ++inner_chunks;
      // The inner call is one serial chunk: chunk 0, whichever outer chunk it runs in.
      if (std::this_thread::get_id() != outer || parallel_thread_index() != 0) same_thread = false;
      EXPECT_EQ(lo, 0);
      EXPECT_EQ(hi, 1000);
    });
    EXPECT_EQ(parallel_thread_index(), index);  // restored for the rest of the outer chunk
  });
  EXPECT_EQ(inner_chunks, 2);
  EXPECT_TRUE(same_thread);
}

TEST_F(ParallelTest, ConcurrentCallersBothGetCorrectResults) {
  set_num_threads(2);
  auto sum_range = [](int64_t n) {
    std::atomic<int64_t> sum{0};
    parallel_for(0, n, 16, [&](int64_t lo, int64_t hi) {
      int64_t s = 0;
      for (int64_t i = lo; i < hi; ++i) s += i;
      sum += s;
    });
    return sum.load();
  };
  std::atomic<int> wrong{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; ++t) {
    callers.emplace_back([&] {
      for (int r = 0; r < 300; ++r) {
        if (sum_range(1000) != 499500) ++wrong;
      }
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(wrong, 0);
}

TEST_F(ParallelTest, ForkedChildMakesItsOwnPool) {
  set_num_threads(2);
  parallel_for(0, 2, 1, [](int64_t, int64_t) {});  // the parent's pool threads exist now
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(20);  // a hang kills the child, which the parent sees
    std::atomic<int64_t> sum{0};
    std::set<int> indices;
    std::mutex mu;
    parallel_for(0, 100, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) sum += i;
      std::lock_guard<std::mutex> lock(mu);
      indices.insert(parallel_thread_index());
    });
    _exit(sum == 4950 && indices.size() == 2 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "child killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST_F(ParallelTest, BadCountsAreRejected) {
  EXPECT_THROW(set_num_threads(0), InvalidArgument);
  EXPECT_THROW(parallel_for(0, 10, 0, [](int64_t, int64_t) {}), InvalidArgument);
  set_num_threads(2);
  EXPECT_EQ(get_num_threads(), 2);
  parallel_for(0, 2, 1, [](int64_t, int64_t) {
    EXPECT_THROW(set_num_threads(1), InvalidArgument);  // not from inside a chunk
  });
}

const char* lookup(const std::map<std::string, std::string>& env, const char* name) {
  const auto it = env.find(name);
  return it == env.end() ? nullptr : it->second.c_str();
}

thread_local std::map<std::string, std::string> fake_env;
const char* fake_getenv(const char* name) { return lookup(fake_env, name); }

TEST(NumThreadsFromEnv, HsgdThenOmpThenAffinity) {
  fake_env = {{"HSGD_NUM_THREADS", "3"}, {"OMP_NUM_THREADS", "5"}};
  EXPECT_EQ(detail::num_threads_from_env(fake_getenv), 3);
  fake_env = {{"OMP_NUM_THREADS", "5"}};
  EXPECT_EQ(detail::num_threads_from_env(fake_getenv), 5);
  fake_env = {{"HSGD_NUM_THREADS", ""}, {"OMP_NUM_THREADS", "4"}};
  EXPECT_EQ(detail::num_threads_from_env(fake_getenv), 4);
  fake_env = {};
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(detail::num_threads_from_env(fake_getenv), CPU_COUNT(&set));
}

// Each bad value of `variable` makes parse(fake_getenv) throw InvalidArgument naming it.
void expect_rejected_by_name(const char* variable, std::initializer_list<const char*> bad_values,
                             int (*parse)(const char* (*)(const char*))) {
  for (const char* bad : bad_values) {
    fake_env = {{variable, bad}};
    try {
      parse(fake_getenv);
      ADD_FAILURE() << variable << ": accepted " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(variable) + "='" + bad + "'"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(NumThreadsFromEnv, BadValuesNameTheVariableAndValue) {
  expect_rejected_by_name("HSGD_NUM_THREADS", {"0", "-2", "two", "3x", "99999"},
                          detail::num_threads_from_env);
  fake_env = {{"OMP_NUM_THREADS", "zero"}};
  EXPECT_THROW(detail::num_threads_from_env(fake_getenv), InvalidArgument);
}

TEST(SpinUsFromEnv, DefaultValueAndBadValues) {
  fake_env = {};
  EXPECT_EQ(detail::spin_us_from_env(fake_getenv), detail::kDefaultSpinUs);
  fake_env = {{"HSGD_SPIN_US", ""}};
  EXPECT_EQ(detail::spin_us_from_env(fake_getenv), detail::kDefaultSpinUs);
  fake_env = {{"HSGD_SPIN_US", "0"}};
  EXPECT_EQ(detail::spin_us_from_env(fake_getenv), 0);
  fake_env = {{"HSGD_SPIN_US", "1000000"}};
  EXPECT_EQ(detail::spin_us_from_env(fake_getenv), 1000000);
  expect_rejected_by_name("HSGD_SPIN_US", {"-1", "1000001", "fast", "20us"},
                          detail::spin_us_from_env);
}

}  // namespace
}  // namespace hsgd
