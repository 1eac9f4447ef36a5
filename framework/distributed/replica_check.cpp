#include "framework/distributed/replica_check.h"

#include <algorithm>
#include <span>

#include "comm/error.h"
#include "comm/format_ranks.h"
#include "comm/process_group/agreement.h"

namespace hsgd::distributed::detail {
namespace {

using hsgd::str_cat;

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

// The message naming the first entry that differs.
std::string first_difference(const std::vector<std::string>& descriptions) {
  std::vector<std::vector<std::string>> lines;
  size_t most = 0;
  for (const std::string& d : descriptions) {
    lines.push_back(split_lines(d));
    most = std::max(most, lines.back().size());
  }
  for (size_t i = 0; i < most; ++i) {
    // Entry i of every rank ("" when a rank has fewer entries).
    std::vector<std::string> entry_i;
    for (const std::vector<std::string>& rank_lines : lines) {
      entry_i.push_back(i < rank_lines.size() ? rank_lines[i] : "");
    }
    const std::vector<comm::RanksWithValue> versions = comm::group_ranks_by_value(entry_i);
    if (versions.size() == 1) continue;
    // Same kind and name everywhere: only the shape (or requires_grad) differs.
    const std::vector<std::string> first = split(versions[0].value, '\t');
    const std::string kind_name = first.size() >= 2 ? first[0] + "\t" + first[1] + "\t" : "\n";
    const bool same_name = std::all_of(versions.begin(), versions.end(), [&](const auto& v) {
      return v.value.rfind(kind_name, 0) == 0;
    });
    std::string out;
    if (same_name) {
      out = str_cat(first[0], quoted(first[1]), " (tensor ", i, ") has shape");
    } else {
      out = str_cat("tensor ", i, " is");
    }
    for (size_t k = 0; k < versions.size(); ++k) {
      out += (k == 0 ? " " : (k + 1 == versions.size() ? " and " : ", "));
      const std::string& v = versions[k].value;
      out += v.empty() ? "missing (fewer tensors)" : same_name ? shape_text(v) : entry_text(v);
      out += str_cat(" on ", hsgd::detail::describe_rank_set(versions[k].ranks));
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
  const std::vector<std::string> descriptions =
      comm::gather_if_different(pg, serialize(entries), "model check");
  if (descriptions.empty()) return;
  // Every rank holds every description, so every rank takes this path and throws.
  HSGD_THROW(InvalidArgument, who, ": ", what, " differs between the ranks of group '", pg.name(),
             "': ", first_difference(descriptions),
             "; every rank must build the same model (same parameters and buffers, with the same ",
             "names, shapes and order). This is rank ", pg.rank());
}

uint64_t values_fingerprint(const std::vector<Tensor>& tensors) {
  uint64_t hash = 1469598103934665603ull;
  for (const Tensor& t : tensors) {
    const Tensor c = t.contiguous();
    const auto* bytes = reinterpret_cast<const unsigned char*>(c.data());
    for (size_t i = 0; i < static_cast<size_t>(c.numel()) * sizeof(float); ++i) {
      hash = (hash ^ bytes[i]) * 1099511628211ull;
    }
  }
  return hash;
}

bool same_values_on_all_ranks(comm::ProcessGroup& pg, const std::vector<Tensor>& tensors,
                              std::string_view label) {
  if (pg.size() == 1) return true;
  const auto mine = static_cast<int64_t>(values_fingerprint(tensors));
  std::vector<int64_t> all(static_cast<size_t>(pg.size()));
  pg.allgather(std::span<const int64_t>(&mine, 1), std::span<int64_t>(all), label)
      ->wait(pg.work_timeout());
  return std::all_of(all.begin(), all.end(), [&](int64_t h) { return h == mine; });
}

}  // namespace hsgd::distributed::detail
