// allreduce_bench: latency of allreduce against message size, at several world sizes, for
//   hsgd      - hsgd::comm::ProcessGroup::allreduce(..., RunOn::kCaller)->wait(), default
//               options (shared memory on one node), as a caller that waits at once
//   hsgd-tcp  - the same with shared memory off: Gloo's TCP pairs with hsgd's algorithm choice,
//               as between nodes
//   tcp-worker - hsgd-tcp with RunOn::kWorker: queued to the group's worker thread, then waited
//               for (what an overlapped collective pays for the hand-off)
//   hsgd-ring - hsgd-tcp forced to AllreduceAlgorithm::kRing (Gloo's zero-copy unbound ring)
//   ring / chunked / hd - Gloo's algorithm objects driven directly (gloo::AllreduceRing,
//               AllreduceRingChunked, AllreduceHalvingDoubling), built once per size, run() in a
//               loop
//   torch     - PyTorch dist.all_reduce on gloo (apps/bench/allreduce_bench_torch.py,
//               /usr/bin/python3), run after the others
//   tcp-NAME  - with --tcp-algorithms NAME,...: hsgd-tcp forced to the AllreduceAlgorithm of that
//               name (to_string's: halving-doubling, ring-chunked, ring, pinned-ring, direct,
//               direct-scatter), as another contender of the same rounds; printed in a second
//               table, to compare what kAuto could choose
//   tls-tcp / plain-tcp - with --compare-transports: hsgd-tcp over the TLS data plane and over
//               plain TCP (InitOptions::insecure) in the same rounds, printed in a table of their
//               own with the ratio tls / plain
// All on 127.0.0.1, float32 sums, one process per rank; rank 0's per-iteration times. Every
// contender above runs over the data plane --transport names: tls (the default, as every job
// runs) or plain. The header states the CPU cost of AES-128-GCM, the cipher of the TLS data
// plane, measured on one core in 16 KiB records as TLS seals them.
//
// Each size runs in rounds; every round runs every contender (but torch) once, the order rotated
// by one each round so that none always follows the same neighbour, each with the same warm-up
// and the same number of timed iterations. A contender's time is the median of its timed
// iterations over all rounds; the spread of tcp/gloo is the smallest and largest ratio of the
// round medians (hsgd-tcp over the fastest raw Gloo algorithm of that round).
//
//   allreduce_bench [--quick] [--ranks 2,4,8] [--rounds 5] [--no-torch] [--only hsgd-tcp,hd]
//                   [--tcp-algorithms direct,direct-scatter,halving-doubling]
//                   [--transport tls|plain] [--compare-transports]
// (--only runs the named contenders alone, e.g. under perf; the others' columns then read 0.
// It does not filter the tcp-NAME contenders.)

#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>

#include "apps/bench/bench_util.h"
#include "comm/process_group/process_group.h"
#include "comm/store/file_store.h"
#include "comm/store/gloo_store.h"
#include "comm/transport/tls_device.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace comm = hsgd::comm;

// The contenders in the order of the table's columns; torch is measured separately.
const std::vector<std::string> kContenders = {"hsgd", "hsgd-tcp", "tcp-worker", "hsgd-ring",
                                              "ring", "chunked",  "hd"};
const std::vector<std::string> kRawGloo = {"ring", "chunked", "hd"};

struct Schedule {
  int rounds = 5;
  bool quick = false;
  std::vector<std::string> only;  // empty: every contender
  // hsgd-tcp forced to each of these algorithms, contenders "tcp-" + to_string(algorithm).
  std::vector<hsgd::comm::AllreduceAlgorithm> tcp_algorithms;
  bool insecure = false;            // --transport plain
  bool compare_transports = false;  // adds tls-tcp and plain-tcp
  // Untimed runs of each contender at the start of each round.
  int warmup(size_t bytes) const { return bytes <= (1u << 20) ? 2 : 1; }
  // Timed runs of each contender per round: fewer as messages grow, so that a full run (4 B to
  // 64 MiB, 2, 4 and 8 ranks) takes a few minutes.
  int iterations(size_t bytes) const {
    if (bytes <= 64 * 1024) return quick ? 16 : 40;
    if (bytes <= 1024 * 1024) return quick ? 4 : 10;
    return std::clamp(static_cast<int>((32u << 20) / bytes), quick ? 1 : 2, 8);
  }
};

// What rank 0 measured of one contender at one size: every timed iteration, by round.
struct Samples {
  std::vector<std::vector<double>> rounds;  // microseconds
  double pooled_median() const {
    std::vector<double> all;
    for (const auto& r : rounds) all.insert(all.end(), r.begin(), r.end());
    return median(all);
  }
};

struct Contender {
  std::string name;
  std::function<void()> run;
};

// Runs the contenders in rounds (see the file comment); returns name -> samples.
std::map<std::string, Samples> time_rounds(const std::vector<Contender>& contenders,
                                           const Schedule& schedule, size_t bytes) {
  std::map<std::string, Samples> out;
  const size_t n = contenders.size();
  if (n == 0) return out;
  for (int round = 0; round < schedule.rounds; ++round) {
    for (size_t k = 0; k < n; ++k) {
      const Contender& c = contenders[(k + static_cast<size_t>(round)) % n];
      for (int i = 0; i < schedule.warmup(bytes); ++i) c.run();
      std::vector<double> times;
      for (int i = 0; i < schedule.iterations(bytes); ++i) {
        const auto start = Clock::now();
        c.run();
        times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
      }
      out[c.name].rounds.push_back(std::move(times));
    }
  }
  return out;
}

// One rank of one world size: measures every contender at every size; returns, on rank 0, one
// line per contender and size: "name bytes rounds iterations t0 t1 ..." (round after round).
std::string run_rank(int rank, int world, const std::filesystem::path& dir,
                     const std::vector<size_t>& sizes, const Schedule& schedule) {
  auto store = std::make_shared<comm::FileStore>(dir);
  const auto timeout = std::chrono::seconds(120);
  const std::string token = "allreduce-bench-token";  // one host, one run: a fixed token will do
  // A group of its own (keys under prefix) with the given allreduce algorithm and shared memory.
  const auto group = [&](const std::string& prefix, comm::AllreduceAlgorithm algorithm,
                         bool shared_memory, bool insecure) {
    return comm::init_process_group({.rank = rank,
                                     .world_size = world,
                                     .store = store,
                                     .key_prefix = prefix,
                                     .token = token,
                                     .insecure = insecure,
                                     .timeout = timeout,
                                     .allreduce_algorithm = algorithm,
                                     .shared_memory = shared_memory});
  };
  const bool insecure = schedule.insecure;
  auto pg = group("", comm::AllreduceAlgorithm::kAuto, true, insecure);
  // hsgd with shared memory off: kAuto over Gloo's TCP transport, as between nodes.
  auto pg_tcp = group("tcp/", comm::AllreduceAlgorithm::kAuto, false, insecure);
  // hsgd forced to Gloo's unbound-buffer ring (zero copy), to document the kAuto choice.
  auto pg_ring = group("ring/", comm::AllreduceAlgorithm::kRing, true, insecure);
  // hsgd-tcp over each data plane, for --compare-transports.
  std::shared_ptr<comm::ProcessGroup> pg_tls, pg_plain;
  if (schedule.compare_transports) {
    pg_tls = group("tls-tcp/", comm::AllreduceAlgorithm::kAuto, false, false);
    pg_plain = group("plain-tcp/", comm::AllreduceAlgorithm::kAuto, false, true);
  }
  // hsgd-tcp forced to each algorithm of --tcp-algorithms.
  std::vector<std::pair<std::string, std::shared_ptr<comm::ProcessGroup>>> pg_forced;
  for (auto algorithm : schedule.tcp_algorithms) {
    const std::string name = std::string("tcp-") + comm::to_string(algorithm);
    pg_forced.emplace_back(name, group(name + "/", algorithm, false, insecure));
  }
  // Raw Gloo: its own context of the same type (rendezvous::Context), own device.
  std::shared_ptr<gloo::transport::Device> device;
  if (insecure) {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    device = gloo::transport::tcp::CreateDevice(attr);
  } else {
    device = comm::transport::create_tls_device({.host = "127.0.0.1", .token = token});
  }
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, world);
  context->setTimeout(timeout);
  auto gloo_store = comm::as_gloo_store(store, "raw/", timeout);
  context->connectFullMesh(*gloo_store, device);

  std::ostringstream results;
  for (size_t bytes : sizes) {
    const size_t n = std::max<size_t>(1, bytes / sizeof(float));
    std::vector<float> data(n, 1.0f);
    const std::vector<float*> ptrs{data.data()};
    const int count = static_cast<int>(n);
    gloo::AllreduceRing<float> ring(context, ptrs, count);
    gloo::AllreduceRingChunked<float> chunked(context, ptrs, count);
    gloo::AllreduceHalvingDoubling<float> hd(context, ptrs, count);
    auto hsgd = [&](comm::ProcessGroup& group, comm::RunOn run_on) {
      return [&group, &data, run_on] {
        group.allreduce(std::span<float>(data), comm::ReduceOp::kSum, {}, run_on)->wait();
      };
    };
    const auto caller = comm::RunOn::kCaller;
    std::vector<Contender> contenders = {{"hsgd", hsgd(*pg, caller)},
                                         {"hsgd-tcp", hsgd(*pg_tcp, caller)},
                                         {"tcp-worker", hsgd(*pg_tcp, comm::RunOn::kWorker)},
                                         {"hsgd-ring", hsgd(*pg_ring, caller)},
                                         {"ring", [&] { ring.run(); }},
                                         {"chunked", [&] { chunked.run(); }},
                                         {"hd", [&] { hd.run(); }}};
    std::erase_if(contenders, [&](const Contender& c) {
      return !schedule.only.empty() &&
             std::find(schedule.only.begin(), schedule.only.end(), c.name) == schedule.only.end();
    });
    for (const auto& [name, group] : pg_forced) contenders.push_back({name, hsgd(*group, caller)});
    if (schedule.compare_transports) {
      contenders.push_back({"tls-tcp", hsgd(*pg_tls, caller)});
      contenders.push_back({"plain-tcp", hsgd(*pg_plain, caller)});
    }
    const auto samples = time_rounds(contenders, schedule, bytes);
    pg->barrier()->wait();
    if (rank != 0) continue;
    for (const auto& [name, s] : samples) {
      results << name << " " << bytes << " " << s.rounds.size() << " " << s.rounds[0].size();
      for (const auto& r : s.rounds) {
        for (double t : r) results << " " << t;
      }
      results << "\n";
    }
  }
  for (const auto& forced : pg_forced) forced.second->shutdown();
  if (pg_tls != nullptr) pg_tls->shutdown();
  if (pg_plain != nullptr) pg_plain->shutdown();
  pg_tcp->shutdown();
  pg_ring->shutdown();
  pg->shutdown();
  return results.str();
}

// Forks the ranks of one world size; returns bytes -> contender -> samples.
std::map<size_t, std::map<std::string, Samples>> run_world(int world,
                                                           const std::vector<size_t>& sizes,
                                                           const Schedule& schedule) {
  const auto dir =
      std::filesystem::temp_directory_path() /
      ("hsgd_allreduce_bench_" + std::to_string(::getpid()) + "_" + std::to_string(world));
  std::filesystem::remove_all(dir);
  std::vector<std::string> out;
  try {
    out = run_forked_ranks(world, std::chrono::minutes(20), "world " + std::to_string(world),
                           [&](int rank) { return run_rank(rank, world, dir, sizes, schedule); });
  } catch (...) {
    std::filesystem::remove_all(dir);
    throw;
  }
  std::filesystem::remove_all(dir);
  std::map<size_t, std::map<std::string, Samples>> rows;
  std::istringstream in(out[0]);
  std::string name;
  size_t bytes = 0, rounds = 0, iters = 0;
  while (in >> name >> bytes >> rounds >> iters) {
    Samples& s = rows[bytes][name];
    s.rounds.assign(rounds, std::vector<double>(iters));
    for (auto& r : s.rounds) {
      for (double& t : r) in >> t;
    }
  }
  return rows;
}

// Runs the PyTorch script; returns bytes -> median us (empty, after printing why, on failure).
std::map<size_t, double> run_torch(const std::string& script, int world,
                                   const std::vector<size_t>& sizes, const Schedule& schedule) {
  std::string sizes_arg, iters_arg;
  for (size_t b : sizes) {
    sizes_arg += (sizes_arg.empty() ? "" : ",") + std::to_string(b);
    iters_arg +=
        (iters_arg.empty() ? "" : ",") + std::to_string(schedule.rounds * schedule.iterations(b));
  }
  std::map<size_t, double> result;
  try {
    const auto lines = run_python_results(
        script, {"--ranks", std::to_string(world), "--sizes", sizes_arg, "--iters", iters_arg},
        1200);
    for (const auto& fields : lines) result[std::stoull(fields.at(0))] = std::stod(fields.at(1));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bench: PyTorch column skipped: %s\n", e.what());
    result.clear();
  }
  return result;
}

std::string human_bytes(size_t b) {
  if (b >= (1u << 20)) return std::to_string(b >> 20) + " MiB";
  if (b >= 1024) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

// The medians of one size by contender name, 0 for a contender that did not run.
std::map<std::string, double> medians(const std::map<std::string, Samples>& row) {
  std::map<std::string, double> t;
  for (const auto& name : kContenders) t[name] = 0;
  for (const auto& [name, samples] : row) t[name] = samples.pooled_median();
  return t;
}

// The fastest raw Gloo algorithm that ran ("" when none did).
std::string best_raw_gloo(std::map<std::string, double>& t) {
  std::string best;
  for (const auto& name : kRawGloo) {
    if (t[name] > 0 && (best.empty() || t[name] < t[best])) best = name;
  }
  return best;
}

// One table row: the medians (0 for a contender left out with --only), hsgd-tcp / best raw Gloo
// with its spread over rounds.
void print_row(int world, size_t bytes, const std::map<std::string, Samples>& row,
               double torch_us) {
  std::map<std::string, double> t = medians(row);
  const std::string best = best_raw_gloo(t);
  double ratio = 0, lo = 0, hi = 0;
  if (!best.empty() && t["hsgd-tcp"] > 0) {
    ratio = t["hsgd-tcp"] / t[best];
    lo = 1e300;
    for (size_t r = 0; r < row.at("hsgd-tcp").rounds.size(); ++r) {
      double best_round = 1e300;
      for (const auto& name : kRawGloo) {
        if (t[name] > 0) best_round = std::min(best_round, median(row.at(name).rounds[r]));
      }
      const double round_ratio = median(row.at("hsgd-tcp").rounds[r]) / best_round;
      lo = std::min(lo, round_ratio);
      hi = std::max(hi, round_ratio);
    }
  }
  std::printf(
      "%5d %7s | %9.1f %9.1f %10.1f %9.1f | %9.1f %9.1f %9.1f %-9s | %9.1f | %6.2f %5.2f-%-5.2f | "
      "%6.2f\n",
      world, human_bytes(bytes).c_str(), t["hsgd"], t["hsgd-tcp"], t["tcp-worker"], t["hsgd-ring"],
      t["ring"], t["chunked"], t["hd"], ("(" + best + ")").c_str(), torch_us, ratio, lo, hi,
      best.empty() ? 0.0 : t["hsgd"] / t[best]);
  std::fflush(stdout);
}

// One row of the second table (--tcp-algorithms): hsgd-tcp and each tcp-NAME, median and ratio
// over the fastest raw Gloo algorithm of the same rounds.
void print_forced_row(int world, size_t bytes, const std::map<std::string, Samples>& row,
                      const std::vector<std::string>& forced) {
  std::map<std::string, double> t = medians(row);
  const std::string best = best_raw_gloo(t);
  std::printf("%5d %7s |", world, human_bytes(bytes).c_str());
  for (const auto& name : forced) {
    const double ratio = best.empty() || t[best] == 0 ? 0 : t[name] / t[best];
    std::printf(" %9.1f %5.2f |", t[name], ratio);
  }
  std::printf(" %9.1f %-9s\n", best.empty() ? 0 : t[best], ("(" + best + ")").c_str());
}

// One row of the transport table (--compare-transports): hsgd-tcp over TLS and over plain TCP,
// the ratio of their medians and its spread over the rounds.
void print_transport_row(int world, size_t bytes, const std::map<std::string, Samples>& row) {
  const Samples& tls = row.at("tls-tcp");
  const Samples& plain = row.at("plain-tcp");
  double lo = 1e300, hi = 0;
  for (size_t r = 0; r < tls.rounds.size(); ++r) {
    const double ratio = median(tls.rounds[r]) / median(plain.rounds[r]);
    lo = std::min(lo, ratio);
    hi = std::max(hi, ratio);
  }
  const double t = tls.pooled_median(), p = plain.pooled_median();
  // The extra time per GB that each rank sent (a ring allreduce sends 2 (p - 1) / p of the
  // buffer per rank), from 1 MiB on (0 below, where latency dominates).
  const double gb_moved = 2.0 * (world - 1) / world * static_cast<double>(bytes) / 1e9;
  std::printf("%5d %7s | %9.1f %9.1f | %6.3f %5.3f-%-5.3f | %8.1f\n", world,
              human_bytes(bytes).c_str(), t, p, t / p, lo, hi,
              bytes >= (1u << 20) ? (t - p) / 1e3 / gb_moved : 0.0);
  std::fflush(stdout);
}

// Seconds of one core per GB sealed with AES-128-GCM in 16 KiB records (TLS's record size), the
// cipher of the TLS data plane: the encryption half of its CPU cost (decryption costs the same).
double aes_gcm_seconds_per_gb() {
  constexpr size_t kRecord = 16 << 10;
  constexpr size_t kTotal = size_t{1} << 30;
  std::vector<unsigned char> in(kRecord, 0x5a), out(kRecord + 16);
  unsigned char key[16] = {1}, iv[12] = {2}, tag[16];
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  EVP_EncryptInit_ex(ctx, EVP_aes_128_gcm(), nullptr, key, iv);
  const auto start = Clock::now();
  for (size_t done = 0; done < kTotal; done += kRecord) {
    int length = 0;
    iv[0]++;
    EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, iv);
    EVP_EncryptUpdate(ctx, out.data(), &length, in.data(), static_cast<int>(kRecord));
    EVP_EncryptFinal_ex(ctx, out.data() + length, &length);
    EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, sizeof(tag), tag);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EVP_CIPHER_CTX_free(ctx);
  return seconds / (static_cast<double>(kTotal) / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"allreduce latency: hsgd vs raw Gloo vs PyTorch"};
  bool no_torch = false;
  Schedule schedule;
  std::vector<int> worlds{2, 4, 8};
  size_t min_bytes = 4, max_bytes = 64u << 20;
  app.add_flag("--quick", schedule.quick,
               "fewer sizes, rounds and iterations (4 B, 64 KiB, 1 MiB, 16 MiB; 2 and 4 ranks)");
  app.add_flag("--no-torch", no_torch, "skip the PyTorch column");
  app.add_option("--ranks", worlds, "world sizes (2-64: raw Gloo needs a peer)")
      ->delimiter(',')
      ->check(CLI::Range(2, 64));
  app.add_option("--rounds", schedule.rounds, "rounds per size (default 5, 3 with --quick)");
  app.add_option("--only", schedule.only, "run only these contenders (hsgd, hsgd-tcp, ...)")
      ->delimiter(',');
  app.add_option("--min-bytes", min_bytes, "smallest message");
  app.add_option("--max-bytes", max_bytes, "largest message");
  std::vector<std::string> tcp_algorithm_names;
  app.add_option("--tcp-algorithms", tcp_algorithm_names,
                 "also run hsgd-tcp forced to each of these algorithms (contenders tcp-NAME; "
                 "halving-doubling, ring-chunked, ring, pinned-ring, direct, direct-scatter), "
                 "shown in a second table")
      ->delimiter(',')
      ->check(CLI::IsMember(hsgd::comm::allreduce_algorithm_names()));
  std::string transport = "tls";
  app.add_option("--transport", transport,
                 "data plane of the contenders: tls (encrypted, the default) or plain")
      ->check(CLI::IsMember({"tls", "plain"}));
  app.add_flag("--compare-transports", schedule.compare_transports,
               "also run hsgd-tcp over TLS and over plain TCP in the same rounds, in a table of "
               "their own (tls-tcp, plain-tcp)");
  std::string torch_script = HSGD_BENCH_DIR "/allreduce_bench_torch.py";
  app.add_option("--torch-script", torch_script, "path of allreduce_bench_torch.py");
  CLI11_PARSE(app, argc, argv);
  schedule.insecure = transport == "plain";
  std::vector<std::string> forced = {"hsgd-tcp"};  // the second table's contenders
  for (const auto& name : tcp_algorithm_names) {
    schedule.tcp_algorithms.push_back(
        hsgd::comm::allreduce_algorithm_named(name, "--tcp-algorithms"));
    forced.push_back("tcp-" + name);
  }

  std::vector<size_t> sizes;
  if (schedule.quick) {
    sizes = {4, 64 << 10, 1 << 20, 16 << 20};
    if (app.count("--ranks") == 0) worlds = {2, 4};
    if (app.count("--rounds") == 0) schedule.rounds = 3;
  } else {
    for (size_t b = min_bytes; b <= max_bytes; b *= 4) sizes.push_back(b);
  }
  HSGD_CHECK(schedule.rounds >= 1, "allreduce_bench: --rounds ", schedule.rounds,
             " must be at least 1");

  std::printf(
      "allreduce_bench: float32 sum on 127.0.0.1 over the %s data plane, medians of rank 0 (us), "
      "%d rounds\n",
      schedule.insecure ? "plain TCP" : "TLS", schedule.rounds);
  const double aes = aes_gcm_seconds_per_gb();
  std::printf("AES-128-GCM on one core, 16 KiB records: %.2f GB/s, %.0f ms of CPU per GB sealed\n",
              1.0 / aes, aes * 1e3);
  std::printf("%5s %7s | %9s %9s %10s %9s | %9s %9s %9s %-9s | %9s | %6s %11s | %6s\n", "ranks",
              "bytes", "hsgd", "hsgd-tcp", "tcp-worker", "hsgd-ring", "ring", "chunked", "hd",
              "(best)", "torch", "tcp/gl", "spread", "hsgd/gl");
  std::map<int, std::map<size_t, std::map<std::string, Samples>>> all_rows;  // by world, bytes
  for (int world : worlds) {
    std::map<size_t, std::map<std::string, Samples>>& rows = all_rows[world];
    try {
      rows = run_world(world, sizes, schedule);
    } catch (const hsgd::Error& e) {
      std::fprintf(stderr, "world %d failed: %s\n", world, e.what());
      return 1;
    }
    const auto torch =
        no_torch ? std::map<size_t, double>{} : run_torch(torch_script, world, sizes, schedule);
    for (const auto& [bytes, row] : rows) {
      print_row(world, bytes, row, torch.count(bytes) ? torch.at(bytes) : 0.0);
    }
  }
  std::printf(
      "hsgd: default (shared memory within the node); hsgd-tcp: shared memory off, Gloo's TCP as\n"
      "between nodes (both run on the calling thread: RunOn::kCaller); tcp-worker: hsgd-tcp on\n"
      "the group's worker thread; hsgd-ring: hsgd-tcp forced to Gloo's ring. tcp/gl: hsgd-tcp\n"
      "over the fastest raw Gloo algorithm (lower is better; medians over all rounds), spread:\n"
      "the smallest and largest ratio of one round's medians; hsgd/gl: hsgd over the same.\n");
  if (schedule.compare_transports) {
    std::printf(
        "\nhsgd-tcp over TLS and over plain TCP, in the same rounds: median us, tls / plain with "
        "its spread over rounds, extra ms per GB each rank sent\n");
    std::printf("%5s %7s | %9s %9s | %6s %11s | %8s\n", "ranks", "bytes", "tls-tcp", "plain-tcp",
                "ratio", "spread", "ms/GB");
    for (const auto& [world, rows] : all_rows) {
      for (const auto& [bytes, row] : rows) print_transport_row(world, bytes, row);
    }
  }
  if (forced.size() == 1) return 0;
  std::printf(
      "\nhsgd-tcp forced to each algorithm, in the same rounds: median us and / best raw Gloo\n");
  std::printf("%5s %7s |", "ranks", "bytes");
  for (const auto& name : forced) std::printf(" %-15s |", name.c_str());
  std::printf(" %-19s\n", "best raw Gloo");
  for (const auto& [world, rows] : all_rows) {
    for (const auto& [bytes, row] : rows) print_forced_row(world, bytes, row, forced);
  }
  return 0;
}
