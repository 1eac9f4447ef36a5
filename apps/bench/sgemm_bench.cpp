// sgemm_bench: GFLOP/s of hsgd's kernels::sgemm on each instruction set this CPU runs, of
// OpenBLAS's cblas_sgemm and of PyTorch's torch.mm (sgemm_bench_torch.py), on the products of a
// GPT training step, of ResNet-20's and the MLP's linear layers, and on a 1024^3 square.
//
//   sgemm_bench                                  # the full table: about 5 minutes
//   sgemm_bench --threads 1 --rounds 1 --no-torch --shapes square
//
// Every shape runs as many calls as its batch (the attention products run once per batch-head,
// as attention.cpp calls them) on operands filled with random numbers; a measurement is the
// median time of --reps such batches after one warm-up batch. The implementations alternate, one
// shape at a time, for --rounds rounds, and the table shows the median over the rounds. "thr" is
// hsgd::set_num_threads (hsgd's pool and OpenBLAS) and torch.set_num_threads (PyTorch's OpenBLAS
// threads as well). "path" is what kernels::sgemm runs for the shape (kernels::sgemm_path: the
// CPU's widest instruction set, or OpenBLAS for a very narrow c); the ratios are that column over
// OpenBLAS and PyTorch.

#include <cblas.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "apps/bench/bench_util.h"
#include "framework/kernels/sgemm.h"
#include "hsgd.h"

extern "C" char* openblas_get_corename(void);

namespace {

using hsgd::kernels::simd::Isa;

struct Shape {
  std::string name;
  bool trans_a, trans_b;
  int64_t m, n, k, batch;
};

// The products named by the task: GPT (d_model 128, 4 heads, context 128, batch 32: 4096 rows),
// ResNet-20's classifier (batch 128), the MLP's first layer (batch 128), and a large square.
// Linear layers run y = x w^T (nt); their backward dx = dy w (nn) and dw = dy^T x (tn).
std::vector<Shape> all_shapes() {
  return {
      {"gpt qkv fwd", false, true, 4096, 384, 128, 1},
      {"gpt proj fwd", false, true, 4096, 128, 128, 1},
      {"gpt fc1 fwd", false, true, 4096, 512, 128, 1},
      {"gpt fc2 fwd", false, true, 4096, 128, 512, 1},
      {"gpt qkv dx", false, false, 4096, 128, 384, 1},
      {"gpt fc1 dx", false, false, 4096, 128, 512, 1},
      {"gpt fc2 dx", false, false, 4096, 512, 128, 1},
      {"gpt qkv dw", true, false, 384, 128, 4096, 1},
      {"gpt fc1 dw", true, false, 512, 128, 4096, 1},
      {"gpt fc2 dw", true, false, 128, 512, 4096, 1},
      {"attn q k^T x128", false, true, 128, 128, 32, 128},
      {"attn p v x128", false, false, 128, 32, 128, 128},
      {"attn p^T dout x128", true, false, 128, 32, 128, 128},
      {"resnet fc fwd", false, true, 128, 10, 64, 1},
      {"resnet fc dw", true, false, 10, 64, 128, 1},
      {"mlp fc1 fwd", false, true, 128, 512, 784, 1},
      {"mlp fc1 dw", true, false, 512, 784, 128, 1},
      {"square 1024", false, false, 1024, 1024, 1024, 1},
  };
}

// Operands of one shape: batch copies of op(a), op(b) and c in their stored layouts.
struct Operands {
  int64_t lda, ldb, ldc, a_size, b_size, c_size;
  std::vector<float> a, b, c;
};

Operands make_operands(const Shape& s) {
  Operands o;
  o.lda = s.trans_a ? s.m : s.k;
  o.ldb = s.trans_b ? s.k : s.n;
  o.ldc = s.n;
  o.a_size = s.m * s.k, o.b_size = s.k * s.n, o.c_size = s.m * s.n;
  hsgd::Generator gen(1);
  o.a = hsgd::randn({s.batch * o.a_size}, gen).to_vector();
  o.b = hsgd::randn({s.batch * o.b_size}, gen).to_vector();
  o.c.assign(static_cast<size_t>(s.batch * o.c_size), 0.0f);
  return o;
}

// GFLOP/s of the median of reps timed batches (after one warm-up batch) of call(i), i < batch.
double gflops(const Shape& s, int reps, const std::function<void(int64_t)>& call) {
  auto batch = [&] {
    for (int64_t i = 0; i < s.batch; ++i) call(i);
  };
  batch();
  std::vector<double> seconds;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    batch();
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * static_cast<double>(s.m * s.n * s.k * s.batch) / median(seconds) / 1e9;
}

double hsgd_gflops(const Shape& s, Operands& o, int reps, Isa isa) {
  return gflops(s, reps, [&](int64_t i) {
    hsgd::kernels::sgemm(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, o.a.data() + i * o.a_size,
                         o.lda, o.b.data() + i * o.b_size, o.ldb, 0.0f, o.c.data() + i * o.c_size,
                         o.ldc, isa);
  });
}

double openblas_gflops(const Shape& s, Operands& o, int reps) {
  return gflops(s, reps, [&](int64_t i) {
    cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans,
                s.trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(s.m), static_cast<int>(s.n),
                static_cast<int>(s.k), 1.0f, o.a.data() + i * o.a_size, static_cast<int>(o.lda),
                o.b.data() + i * o.b_size, static_cast<int>(o.ldb), 0.0f, o.c.data() + i * o.c_size,
                static_cast<int>(o.ldc));
  });
}

// The shape as sgemm_bench_torch.py reads it: name:ta:tb:m:n:k:batch.
std::string shape_arg(const Shape& s) {
  return s.name + ":" + std::to_string(s.trans_a) + ":" + std::to_string(s.trans_b) + ":" +
         std::to_string(s.m) + ":" + std::to_string(s.n) + ":" + std::to_string(s.k) + ":" +
         std::to_string(s.batch);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> threads = {1, 2};
  std::vector<std::string> only;
  int rounds = 5, reps = 7;
  bool no_torch = false;
  std::string script = HSGD_BENCH_DIR "/sgemm_bench_torch.py";
  CLI::App app{"GFLOP/s of hsgd's sgemm on each ISA vs OpenBLAS and PyTorch."};
  app.add_option("--threads", threads, "Thread counts")->delimiter(',')->capture_default_str();
  app.add_option("--shapes", only, "Only shapes whose name contains one of these")->delimiter(',');
  app.add_option("--rounds", rounds, "Rounds alternating the implementations (median reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_option("--reps", reps, "Timed batches per measurement (median)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_flag("--no-torch", no_torch, "Skip PyTorch");
  app.add_option("--torch-script", script, "Path of sgemm_bench_torch.py")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    std::vector<Shape> shapes;
    for (const Shape& s : all_shapes()) {
      bool keep = only.empty();
      for (const std::string& word : only) keep = keep || s.name.find(word) != std::string::npos;
      if (keep) shapes.push_back(s);
    }
    HSGD_CHECK(!shapes.empty(), "--shapes: no shape matches");
    for (int t : threads) HSGD_CHECK(t >= 1, "--threads: ", t, " must be at least 1");
    std::vector<Isa> isas;
    for (Isa isa : {Isa::kAvx512, Isa::kAvx2}) {
      if (hsgd::kernels::simd::isa_supported(isa)) isas.push_back(isa);
    }
    const Isa chosen = hsgd::kernels::sgemm_isa();
    std::printf("sgemm_bench: CPU %s; kernels::sgemm uses %s; OpenBLAS core %s\n",
                cpu_model().c_str(), hsgd::kernels::simd::isa_name(chosen),
                openblas_get_corename());
    std::printf("GFLOP/s, median over %d rounds of the median of %d batches\n", rounds, reps);

    // results[column][shape name + threads] = one value per round.
    std::map<std::string, std::map<std::string, std::vector<double>>> results;
    for (int r = 0; r < rounds; ++r) {
      for (int t : threads) {
        hsgd::set_num_threads(t);
        for (const Shape& s : shapes) {
          Operands o = make_operands(s);
          const std::string key = s.name + "/" + std::to_string(t);
          for (Isa isa : isas) {
            results[hsgd::kernels::simd::isa_name(isa)][key].push_back(
                hsgd_gflops(s, o, reps, isa));
          }
          results["openblas"][key].push_back(openblas_gflops(s, o, reps));
        }
        if (!no_torch) {
          std::vector<std::string> args = {"--threads", std::to_string(t), "--reps",
                                           std::to_string(reps)};
          for (const Shape& s : shapes) args.push_back(shape_arg(s));
          for (const auto& fields : run_python_results(script, args, 900)) {
            HSGD_CHECK(fields.size() == 2, "sgemm_bench_torch.py: RESULT line with ", fields.size(),
                       " fields, expected 2");
            std::string name = fields[0];
            std::replace(name.begin(), name.end(), '_', ' ');
            results["torch"][name + "/" + std::to_string(t)].push_back(std::stod(fields[1]));
          }
        }
      }
      std::fprintf(stderr, "round %d of %d done\n", r + 1, rounds);
    }

    std::vector<std::string> columns;
    for (Isa isa : isas) columns.push_back(hsgd::kernels::simd::isa_name(isa));
    columns.push_back("openblas");
    if (!no_torch) columns.push_back("torch");
    const std::string mine = hsgd::kernels::simd::isa_name(chosen);
    std::printf("\n%-20s %2s %5s %5s %5s %5s %3s %-8s", "shape", "op", "m", "n", "k", "calls",
                "thr", "path");
    for (const auto& c : columns) {
      std::printf(" %11s", (c == "avx512" || c == "avx2" ? "hsgd_" + c : c).c_str());
    }
    std::printf(" %9s%s\n", "/openblas", no_torch ? "" : "    /torch");
    for (const Shape& s : shapes) {
      for (int t : threads) {
        const std::string key = s.name + "/" + std::to_string(t);
        std::map<std::string, double> med;
        for (const auto& c : columns) med[c] = median(results[c][key]);
        const std::string op = std::string(s.trans_a ? "t" : "n") + (s.trans_b ? "t" : "n");
        const Isa path = hsgd::kernels::sgemm_path(s.m, s.n, chosen);
        std::printf("%-20s %2s %5lld %5lld %5lld %5lld %3d %-8s", s.name.c_str(), op.c_str(),
                    static_cast<long long>(s.m), static_cast<long long>(s.n),
                    static_cast<long long>(s.k), static_cast<long long>(s.batch), t,
                    path == Isa::kBaseline ? "openblas" : hsgd::kernels::simd::isa_name(path));
        for (const auto& c : columns) std::printf(" %11.1f", med[c]);
        if (chosen != Isa::kBaseline) {
          std::printf(" %9.2f", med[mine] / med["openblas"]);
          if (!no_torch) std::printf(" %9.2f", med[mine] / med["torch"]);
        }
        std::printf("\n");
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sgemm_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
