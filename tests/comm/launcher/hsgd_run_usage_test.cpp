// Every usage error of hsgd-run exits 2 with a message naming the flag and the value, before any
// network step. Runs the real binary once per row. "Before any network step"
// is checked twice: the endpoint of the multi-node rows is a port nobody listens on, so a
// launcher that tried to connect would report "cannot reach" (exit 1) instead; and every row
// must finish long before the 300 s --rdzv-timeout it would otherwise wait.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "command.h"
#include "tests/support/multiprocess.h"

namespace hsgd::testing {
namespace {

using std::chrono::seconds;
namespace fs = std::filesystem;

const std::string kRun = HSGD_RUN_PATH;
const std::string kWorker = LAUNCHER_TEST_WORKER_PATH;

struct Row {
  std::string what;
  std::vector<std::string> args;   // after the binary
  std::vector<std::string> texts;  // each must appear in the output
};

TEST(HsgdRunUsageTest, EveryUsageErrorExits2NamingFlagAndValue) {
  const auto dir = unique_temp_dir("hsgd_run_usage");
  const std::string file = (dir / "a_file").string();
  std::ofstream(file) << "not a directory\n";
  const std::string no_exec = (dir / "not_executable").string();
  std::ofstream(no_exec) << "#!/bin/sh\n";
  const std::string far = "127.0.0.1:9";  // discard port: nothing listens on loopback
  const std::vector<std::string> prog = {"--", kWorker, "env", dir.string()};
  auto with = [&](std::vector<std::string> flags) {
    flags.insert(flags.end(), prog.begin(), prog.end());
    return flags;
  };
  const std::vector<Row> rows = {
      {"unknown flag before the program", {"--bogus", kWorker, "env"}, {"unknown flag '--bogus'"}},
      {"unknown flag with --", {"--nproc", "2", "--", kWorker}, {"unknown flag '--nproc'"}},
      {"misspelt flag",
       {"--max-restart", "2", "--", kWorker},
       {"unknown flag '--max-restart'; did you mean --max-restarts?"}},
      {"nproc four",
       with({"--nproc-per-node", "four"}),
       {"--nproc-per-node 'four': expected an integer"}},
      {"rdzv timeout abc",
       with({"--rdzv-timeout", "abc"}),
       {"--rdzv-timeout 'abc': expected a number of seconds"}},
      {"no program", {"--nproc-per-node", "2"}, {"no program given"}},
      {"no program after --", {"--"}, {"no program given"}},
      {"program missing", {"--", (dir / "missing").string()}, {"program '", "missing'"}},
      {"program not on PATH", {"--", "no-such-program-hsgd"}, {"'no-such-program-hsgd' not found"}},
      {"program not executable", {"--", no_exec}, {"not_executable' does not exist or is not"}},
      {"program is a directory", {"--", dir.string()}, {"is not an executable file"}},
      {"port 70000",
       with({"--nnodes", "2", "--rdzv-endpoint", "host:70000"}),
       {"'host:70000' has port '70000'", "1 to 65535"}},
      {"port abc", with({"--nnodes", "2", "--rdzv-endpoint", "host:abc"}), {"port 'abc'"}},
      {"endpoint without host",
       with({"--nnodes", "2", "--rdzv-endpoint", ":29400"}),
       {"':29400' has no host"}},
      {"missing token file",
       with({"--token-file", (dir / "no_token").string()}),
       {"--token-file", "no_token'"}},
      {"standalone with 2 nodes",
       with({"--standalone", "--nnodes", "2"}),
       {"--standalone runs one node, but --nnodes is 2"}},
      {"2 nodes without endpoint", with({"--nnodes", "2"}), {"--nnodes 2 needs --rdzv-endpoint"}},
      {"node rank 3 of 2",
       with({"--nnodes", "2", "--node-rank", "3", "--rdzv-endpoint", far}),
       {"--node-rank 3: expected a node rank from 0 to 1 for --nnodes 2"}},
      {"nproc 0",
       with({"--nproc-per-node", "0"}),
       {"--nproc-per-node 0: expected an integer from 1 to 65536"}},
      {"nnodes abc", with({"--nnodes", "abc"}), {"--nnodes", "abc"}},
      {"nnodes range reversed",
       with({"--nnodes", "3:2", "--rdzv-endpoint", far}),
       {"--nnodes '3:2': expected MIN:MAX with MIN <= MAX, but MIN 3 > MAX 2"}},
      {"nnodes range from 0",
       with({"--nnodes", "0:2", "--rdzv-endpoint", far}),
       {"--nnodes '0:2': expected MIN:MAX, whole numbers with 1 <= MIN <= MAX"}},
      {"nnodes range a:b",
       with({"--nnodes", "a:b", "--rdzv-endpoint", far}),
       {"--nnodes 'a:b': expected MIN:MAX"}},
      {"elastic without endpoint",
       with({"--nnodes", "1:2"}),
       {"--nnodes 1:2 needs --rdzv-endpoint"}},
      {"rdzv last call -1",
       with({"--nnodes", "1:2", "--rdzv-endpoint", far, "--rdzv-last-call", "-1"}),
       {"--rdzv-last-call -1: expected a number of seconds, at least 0"}},
      {"heartbeat 0.1",
       with({"--heartbeat-timeout", "0.1"}),
       {"--heartbeat-timeout 0.1: expected a number of seconds, at least 0.2 and at most 86400 "
        "(one day)"}},
      {"unwritable log dir",
       with({"--log-dir", file + "/logs"}),
       {"--log-dir '" + file + "/logs'", "Not a directory"}},
      {"rdzv timeout 1e300",
       with({"--rdzv-timeout", "1e300"}),
       {"--rdzv-timeout 1e+300: expected a number of seconds, more than 0 and at most 31536000 "
        "(one year)"}},
      {"rdzv timeout nan", with({"--rdzv-timeout", "nan"}), {"--rdzv-timeout nan: expected"}},
      {"rdzv timeout 0", with({"--rdzv-timeout", "0"}), {"--rdzv-timeout 0: expected"}},
      {"grace -1",
       with({"--grace-period", "-1"}),
       {"--grace-period -1: expected a number of seconds, at least 0 and"}},
      {"tail lines -1",
       with({"--tail-lines", "-1"}),
       {"--tail-lines -1: expected an integer from 0 to 100000"}},
      {"max restarts -1",
       with({"--max-restarts", "-1"}),
       {"--max-restarts -1: expected an integer from 0"}},
      {"empty rdzv id", with({"--rdzv-id", ""}), {"--rdzv-id '': the job id is empty"}},
      {"worker timeout 0.1",
       with({"--worker-timeout", "0.1"}),
       {"--worker-timeout 0.1: expected", "or 0 to turn it off"}},
      {"bad flag from the environment", with({}), {"--nproc-per-node 0: expected"}},
  };
  for (const Row& row : rows) {
    std::vector<std::string> argv = {kRun};
    argv.insert(argv.end(), row.args.begin(), row.args.end());
    std::vector<std::string> env;
    if (row.what == "bad flag from the environment") env.push_back("HSGD_NPROC_PER_NODE=0");
    auto result = Command::start(argv, env).wait(seconds(60));
    SCOPED_TRACE(row.what + "\n--- output ---\n" + result.output);
    EXPECT_FALSE(result.timed_out);
    EXPECT_EQ(result.status.signal, 0);
    EXPECT_EQ(result.status.exit_code, 2);
    EXPECT_NE(result.output.find("hsgd-run: error: "), std::string::npos);
    for (const std::string& text : row.texts) {
      EXPECT_NE(result.output.find(text), std::string::npos) << "missing: " << text;
    }
    // Plain words, not CLI11's "not in range 0.000000 to 1.79e308", and no worker started.
    EXPECT_EQ(result.output.find("not in range"), std::string::npos);
    for (const char* network : {"rendezvous: ", "cannot reach", "attempt 0"}) {
      EXPECT_EQ(result.output.find(network), std::string::npos) << "a network step ran";
    }
    EXPECT_FALSE(fs::exists(dir / "env_attempt0_rank0")) << "a worker ran";
  }
  // And a valid command line still runs.
  auto ok = Command::start(with({kRun, "--nproc-per-node", "2"})).wait(seconds(90));
  EXPECT_EQ(ok.status.exit_code, 0) << ok.output;
}

// The hint about '--' belongs where a program was likely meant (a path), not after a misspelt or
// unknown flag; CLI11's "Could not convert" does not reach the user.
TEST(HsgdRunUsageTest, HintsFitTheMistake) {
  const auto run = [](std::vector<std::string> args) {
    args.insert(args.begin(), kRun);
    return Command::start(args).wait(seconds(30));
  };
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--max-restart", "2", "--", kWorker}, {"--bogus", kWorker}}) {
    const auto result = run(args);
    EXPECT_EQ(result.status.exit_code, 2) << result.output;
    EXPECT_EQ(result.output.find("put '--' before"), std::string::npos) << result.output;
  }
  const auto bogus = run({"--bogus", kWorker});
  EXPECT_EQ(bogus.output.find("did you mean"), std::string::npos) << bogus.output;
  const auto path = run({"-x/train", kWorker});
  EXPECT_NE(path.output.find("put '--' before it"), std::string::npos) << path.output;
  // More workers than cores runs, with a word about it.
  const int many = static_cast<int>(std::thread::hardware_concurrency()) + 1;
  const auto dir = unique_temp_dir("hsgd_run_oversubscribed");
  const auto over =
      run({"--nproc-per-node", std::to_string(many), "--", kWorker, "env", dir.string()});
  EXPECT_EQ(over.status.exit_code, 0) << over.output;
  EXPECT_NE(over.output.find("warning: --nproc-per-node " + std::to_string(many) +
                             " on a machine with " + std::to_string(many - 1) + " cores"),
            std::string::npos)
      << over.output;
  const auto four = run({"--nproc-per-node", "four", "--", kWorker});
  EXPECT_EQ(four.output.find("Could not convert"), std::string::npos) << four.output;
}

}  // namespace
}  // namespace hsgd::testing
