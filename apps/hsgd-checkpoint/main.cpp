// hsgd-checkpoint: looks into checkpoints written by framework/checkpoint/ (the examples'
// --checkpoint-dir).
//
//   hsgd-checkpoint show ckpt/step_400             # manifest, and rank 0's entries
//   hsgd-checkpoint show ckpt/step_400 --rank 2
//   hsgd-checkpoint diff a/step_400 b/step_400 --only model. --tolerance 1e-6
//
// diff compares the tensor entries of one rank's files (rank 0 by default) and prints, per
// entry, the max relative error max_i |a_i - b_i| / max_i |b_i| (0 when b is all zeros and a
// equals it); it exits 1 when an entry is missing on one side, has another shape, or exceeds
// --tolerance, so scripts and tests can use it. Exit 2 on usage errors, 1 on unreadable files.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "framework/checkpoint/checkpoint_file.h"

namespace {

using namespace hsgd;
using namespace hsgd::checkpoint;

proto::Manifest read_manifest(const std::string& dir) {
  proto::Manifest manifest;
  const std::string path = dir + "/" + kManifestName;
  if (!manifest.ParseFromString(read_envelope(path, kManifestKind))) {
    throw CheckpointError("'" + path + "' does not parse as a manifest");
  }
  return manifest;
}

StateDict read_rank(const std::string& dir, int rank) {
  const std::string path = dir + "/" + rank_file_name(rank);
  proto::RankState state;
  if (!state.ParseFromString(read_envelope(path, kRankKind))) {
    throw CheckpointError("'" + path + "' does not parse as a rank state");
  }
  return decode_state(state, path);
}

std::string describe(const StateValue& value) {
  if (const auto* d = std::get_if<double>(&value)) return "double " + std::to_string(*d);
  if (const auto* i = std::get_if<int64_t>(&value)) return "int64 " + std::to_string(*i);
  if (const auto* b = std::get_if<std::string>(&value)) {
    return "bytes (" + std::to_string(b->size()) + ")";
  }
  const Tensor& t = std::get<Tensor>(value);
  std::string shape;
  for (int64_t d : t.shape()) shape += (shape.empty() ? "" : "x") + std::to_string(d);
  return "tensor " + (shape.empty() ? std::string("scalar") : shape);
}

int show(const std::string& dir, int rank) {
  const proto::Manifest m = read_manifest(dir);
  std::printf(
      "checkpoint %s: step %lld, world size %d (local %d), mode '%s', hierarchy '%s', "
      "model '%s', hsgd %s, replicas equal: %s%s\n",
      dir.c_str(), static_cast<long long>(m.step()), m.run().world_size(),
      m.run().local_world_size(), m.run().mode().c_str(), m.run().hierarchy().c_str(),
      m.run().model().c_str(), m.run().hsgd_version().c_str(), m.replicas_equal() ? "yes" : "no",
      m.partial() ? ", partial (restores only the objects it holds)" : "");
  for (const proto::FileInfo& f : m.files()) {
    std::printf("  %-10s %12llu bytes  crc32 %u\n", f.name().c_str(),
                static_cast<unsigned long long>(f.size()), f.crc32());
  }
  std::printf("entries of rank %d:\n", rank);
  const StateDict state = read_rank(dir, rank);
  for (const auto& [key, value] : state.entries()) {
    std::printf("  %-50s %s\n", key.c_str(), describe(value).c_str());
  }
  return 0;
}

int diff(const std::string& a_dir, const std::string& b_dir, int rank, const std::string& only,
         double tolerance) {
  const StateDict a = read_rank(a_dir, rank).with_prefix(only);
  const StateDict b = read_rank(b_dir, rank).with_prefix(only);
  int problems = 0;
  double worst = 0;
  for (const auto& [key, value] : a.entries()) {
    const Tensor* ta = std::get_if<Tensor>(&value);
    if (ta == nullptr) continue;
    const StateValue* vb = b.find(key);
    const Tensor* tb = vb ? std::get_if<Tensor>(vb) : nullptr;
    if (tb == nullptr || tb->shape() != ta->shape()) {
      std::printf("%-50s missing or another shape in %s\n", (only + key).c_str(), b_dir.c_str());
      ++problems;
      continue;
    }
    const std::vector<float> x = ta->to_vector(), y = tb->to_vector();
    double max_diff = 0, scale = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(x[i]) - y[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(y[i])));
    }
    const double relative = max_diff == 0 ? 0 : (scale > 0 ? max_diff / scale : INFINITY);
    worst = std::max(worst, relative);
    const bool bad = !(relative <= tolerance);
    problems += bad ? 1 : 0;
    std::printf("%-50s %.3e%s\n", (only + key).c_str(), relative, bad ? "  > tolerance" : "");
  }
  for (const auto& [key, value] : b.entries()) {
    if (std::holds_alternative<Tensor>(value) && !a.contains(key)) {
      std::printf("%-50s missing in %s\n", (only + key).c_str(), a_dir.c_str());
      ++problems;
    }
  }
  std::printf("max relative error %.3e over rank %d's tensors%s: %s (tolerance %g)\n", worst, rank,
              only.empty() ? "" : (" under '" + only + "'").c_str(),
              problems == 0 ? "equal" : "DIFFERENT", tolerance);
  return problems == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Inspect and compare hsgd checkpoints (DIR/step_<N> directories)."};
  app.require_subcommand(1);
  std::string dir, other, only;
  int rank = 0;
  double tolerance = 0;
  CLI::App* show_cmd = app.add_subcommand("show", "Print the manifest and one rank's entries");
  show_cmd->add_option("checkpoint", dir, "A checkpoint directory")->required();
  show_cmd->add_option("--rank", rank, "Whose entries to print")->capture_default_str();
  CLI::App* diff_cmd = app.add_subcommand(
      "diff",
      "Compare the tensors of two checkpoints; exit 1 when they differ by more than "
      "--tolerance");
  diff_cmd->add_option("a", dir, "A checkpoint directory")->required();
  diff_cmd->add_option("b", other, "Another checkpoint directory")->required();
  diff_cmd->add_option("--rank", rank, "Whose files to compare")->capture_default_str();
  diff_cmd->add_option("--only", only, "Only entries whose key starts with this, e.g. model.");
  diff_cmd->add_option("--tolerance", tolerance, "Largest max relative error accepted")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  if (rank < 0) {
    std::fprintf(stderr, "hsgd-checkpoint: error: --rank %d must be at least 0\n", rank);
    return 2;
  }
  try {
    if (*show_cmd) return show(dir, rank);
    return diff(dir, other, rank, only, tolerance);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hsgd-checkpoint: error: %s\n", e.what());
    return 1;
  }
}
