#include "framework/distributed/replica_check.h"

#include <algorithm>
#include <cstring>
#include <span>

#include "comm/error.h"

namespace hsgd::distributed::detail {
namespace {

using hsgd::detail::str_cat;

// " 'name'", or "" for an unnamed entry.
std::string quoted(const std::string& name) {
  return name.empty() ? std::string() : str_cat(" '", name, "'");
}

// One entry as a line of tab-separated fields: kind, name, shape, then "frozen" or "".
std::string entry_line(const TensorEntry& e) {
  return e.kind + "\t" + e.name + "\t" + shape_str(e.shape) + "\t" + (e.frozen ? "frozen" : "");
}

// All entries as one string, one line each (names never hold a tab or a newline: module paths).
std::string serialize(const std::vector<TensorEntry>& entries) {
  std::string out;
  for (const TensorEntry& e : entries) out += entry_line(e) + "\n";
  return out;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(separator, begin);
    if (end == std::string::npos) end = text.size();
    parts.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return parts;
}

// "parameter 'conv.weight' [64, 3, 3, 3]" from a line.
std::string entry_text(const std::string& line) {
  const std::vector<std::string> f = split(line, '\t');
  if (f.size() < 4) return line;
  return str_cat(f[0], quoted(f[1]), " ", f[2]) + (f[3].empty() ? "" : " (requires_grad false)");
}

// What distinguishes a version when every rank has the entry with the same kind and name.
std::string shape_text(const std::string& line) {
  const std::vector<std::string> f = split(line, '\t');
  if (f.size() < 4) return line;
  return f[2] + (f[3].empty() ? "" : " (requires_grad false)");
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines = split(text, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();  // after the last '\n'
  return lines;
}

int64_t fnv1a(const std::string& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return static_cast<int64_t>(h);
}

// "rank 1", "ranks 0, 2-3".
std::string rank_set(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
    if (j == i + 1) out += str_cat(", ", ranks[j]);
    if (j > i + 1) out += str_cat("-", ranks[j]);
    i = j + 1;
  }
  return out;
}

// Every rank's serialized entries, gathered through two allgathers (lengths, then the bytes
// packed into int64 words and padded to the longest).
std::vector<std::string> gather_descriptions(comm::ProcessGroup& pg, const std::string& mine) {
  const size_t n = static_cast<size_t>(pg.size());
  const std::vector<int64_t> length{static_cast<int64_t>(mine.size())};
  std::vector<int64_t> lengths(n);
  pg.allgather(std::span<const int64_t>(length), std::span<int64_t>(lengths), "model check")
      ->wait(pg.work_timeout());
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  const size_t words = static_cast<size_t>(longest + 7) / 8;
  std::vector<int64_t> packed(words, 0);
  std::memcpy(packed.data(), mine.data(), mine.size());
  std::vector<int64_t> all(words * n);
  pg.allgather(std::span<const int64_t>(packed), std::span<int64_t>(all), "model check")
      ->wait(pg.work_timeout());
  std::vector<std::string> out(n);
  for (size_t r = 0; r < n; ++r) {
    out[r].resize(static_cast<size_t>(lengths[r]));
    std::memcpy(out[r].data(), all.data() + r * words, out[r].size());
  }
  return out;
}

// The message naming the first entry that differs.
std::string first_difference(const std::vector<std::string>& descriptions) {
  std::vector<std::vector<std::string>> lines;
  size_t most = 0;
  for (const std::string& d : descriptions) {
    lines.push_back(split_lines(d));
    most = std::max(most, lines.back().size());
  }
  for (size_t i = 0; i < most; ++i) {
    // The ranks holding each version of entry i, in the order of their lowest rank ("" when a
    // rank has fewer entries).
    std::vector<std::pair<std::string, std::vector<int>>> versions;
    for (size_t r = 0; r < lines.size(); ++r) {
      const std::string v = i < lines[r].size() ? lines[r][i] : "";
      auto it = std::find_if(versions.begin(), versions.end(),
                             [&](const auto& p) { return p.first == v; });
      if (it == versions.end()) {
        versions.push_back({v, {static_cast<int>(r)}});
      } else {
        it->second.push_back(static_cast<int>(r));
      }
    }
    if (versions.size() == 1) continue;
    // Same kind and name everywhere: only the shape (or requires_grad) differs.
    const std::vector<std::string> first = split(versions[0].first, '\t');
    const std::string kind_name = first.size() >= 2 ? first[0] + "\t" + first[1] + "\t" : "\n";
    const bool same_name = std::all_of(versions.begin(), versions.end(), [&](const auto& v) {
      return v.first.rfind(kind_name, 0) == 0;
    });
    std::string out;
    if (same_name) {
      out = str_cat(first[0], quoted(first[1]), " (tensor ", i, ") has shape");
    } else {
      out = str_cat("tensor ", i, " is");
    }
    for (size_t k = 0; k < versions.size(); ++k) {
      out += (k == 0 ? " " : (k + 1 == versions.size() ? " and " : ", "));
      const std::string& v = versions[k].first;
      out += v.empty() ? "missing (fewer tensors)" : same_name ? shape_text(v) : entry_text(v);
      out += str_cat(" on ", rank_set(versions[k].second));
    }
    return out;
  }
  return "the descriptions are equal but their digests differ";  // unreachable in practice
}

}  // namespace

std::vector<TensorEntry> describe_module(const nn::Module& module) {
  std::vector<TensorEntry> out;
  for (const auto& [name, p] : module.named_parameters()) {
    out.push_back(
        {.kind = "parameter", .name = name, .shape = p.shape(), .frozen = !p.requires_grad()});
  }
  for (const auto& [name, b] : module.named_buffers()) {
    out.push_back({.kind = "buffer", .name = name, .shape = b.shape()});
  }
  return out;
}

std::vector<TensorEntry> describe_tensors(const std::vector<Tensor>& tensors, const char* kind) {
  std::vector<TensorEntry> out;
  for (size_t i = 0; i < tensors.size(); ++i) {
    HSGD_CHECK(tensors[i].defined(), kind, " ", i, " is undefined");
    out.push_back({.kind = str_cat(kind, " ", i), .name = "", .shape = tensors[i].shape()});
  }
  return out;
}

void check_same_tensors(comm::ProcessGroup& pg, const std::string& who,
                        const std::vector<TensorEntry>& entries, const char* what) {
  if (pg.size() == 1) return;
  const std::string mine = serialize(entries);
  int64_t total = 0;
  for (const TensorEntry& e : entries) total += shape_numel(e.shape);
  const std::vector<int64_t> record{fnv1a(mine), static_cast<int64_t>(entries.size()), total};
  std::vector<int64_t> all(record.size() * static_cast<size_t>(pg.size()));
  pg.allgather(std::span<const int64_t>(record), std::span<int64_t>(all), "model check")
      ->wait(pg.work_timeout());
  bool same = true;
  for (size_t i = record.size(); i < all.size(); ++i) same = same && all[i] == all[i % 3];
  if (same) return;
  // Every rank sees the same records, so every rank takes this path and throws.
  const std::string difference = first_difference(gather_descriptions(pg, mine));
  HSGD_THROW(InvalidArgument, who, ": ", what, " differs between the ranks of group '", pg.name(),
             "': ", difference, "; every rank must build the same model (same parameters and ",
             "buffers, with the same names, shapes and order). This is rank ", pg.rank());
}

}  // namespace hsgd::distributed::detail
