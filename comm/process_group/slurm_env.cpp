#include "comm/process_group/slurm_env.h"

#include <charconv>
#include <cstdlib>
#include <numeric>

#include "comm/error.h"

namespace hsgd::comm {
namespace {

// No cluster has a million nodes; the limit keeps "n[0-999999999]" from exhausting memory.
constexpr size_t kMaxExpanded = 1'000'000;

// A whole string of decimal digits as a non-negative integer, or nullopt.
std::optional<int64_t> parse_uint(std::string_view text) {
  int64_t value = 0;
  if (text.empty() || text.front() == '-' || text.front() == '+') return std::nullopt;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// Splits text at the commas that are not inside brackets.
std::vector<std::string_view> split_top_level(std::string_view text) {
  std::vector<std::string_view> parts;
  size_t begin = 0;
  int depth = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || (text[i] == ',' && depth == 0)) {
      parts.push_back(text.substr(begin, i - begin));
      begin = i + 1;
    } else if (text[i] == '[') {
      ++depth;
    } else if (text[i] == ']') {
      --depth;
    }
  }
  return parts;
}

// The numbers of one bracketed list ("01-03,07" -> 01 02 03 07), formatted with the width of
// each range's lower bound.
std::vector<std::string> expand_ranges(std::string_view hostlist, std::string_view ranges) {
  const auto fail = [&](std::string_view part, const std::string& why) {
    throw InvalidArgument(str_cat("hostlist '", hostlist, "': '", part, "' ", why,
                                  "; expected numbers or ranges like [01-03,07]"));
  };
  std::vector<std::string> numbers;
  size_t begin = 0;
  while (begin <= ranges.size()) {
    size_t end = ranges.find(',', begin);
    if (end == std::string_view::npos) end = ranges.size();
    const std::string_view item = ranges.substr(begin, end - begin);
    const size_t dash = item.find('-');
    const std::string_view low_text = item.substr(0, dash);
    const std::string_view high_text =
        dash == std::string_view::npos ? low_text : item.substr(dash + 1);
    const auto low = parse_uint(low_text);
    const auto high = parse_uint(high_text);
    if (!low || !high) fail(item, "is not a number or a range of numbers");
    if (*high < *low) fail(item, "is a range whose upper bound is below its lower bound");
    if (static_cast<size_t>(*high - *low) >= kMaxExpanded - numbers.size()) {
      fail(item, "expands to more than 1000000 hosts");
    }
    for (int64_t n = *low; n <= *high; ++n) {
      std::string digits = std::to_string(n);
      if (digits.size() < low_text.size()) {
        digits.insert(0, low_text.size() - digits.size(), '0');
      }
      numbers.push_back(std::move(digits));
    }
    begin = end + 1;
  }
  return numbers;
}

// One entry of a hostlist: literal text and bracketed lists, expanded as their product (the
// first bracket varies slowest, as Slurm orders them).
void expand_entry(std::string_view hostlist, std::string_view entry,
                  std::vector<std::string>& hosts) {
  HSGD_CHECK(!entry.empty(), "hostlist '", hostlist,
             "' has an empty entry; expected names separated by single commas");
  std::vector<std::string> names = {""};
  size_t pos = 0;
  while (pos < entry.size()) {
    const size_t open = entry.find('[', pos);
    const std::string_view literal = entry.substr(pos, open - pos);
    HSGD_CHECK(literal.find(']') == std::string_view::npos, "hostlist '", hostlist, "': entry '",
               entry, "' has a ']' without '['");
    for (auto& name : names) name += literal;
    if (open == std::string_view::npos) break;
    const size_t close = entry.find(']', open);
    HSGD_CHECK(close != std::string_view::npos, "hostlist '", hostlist, "': entry '", entry,
               "' has a '[' without ']'");
    const std::string_view ranges = entry.substr(open + 1, close - open - 1);
    HSGD_CHECK(ranges.find('[') == std::string_view::npos, "hostlist '", hostlist, "': entry '",
               entry, "' has nested brackets");
    const std::vector<std::string> numbers = expand_ranges(hostlist, ranges);
    HSGD_CHECK(names.size() * numbers.size() <= kMaxExpanded - hosts.size(), "hostlist '", hostlist,
               "' expands to more than 1000000 hosts");
    std::vector<std::string> product;
    product.reserve(names.size() * numbers.size());
    for (const auto& name : names) {
      for (const auto& number : numbers) product.push_back(name + number);
    }
    names = std::move(product);
    pos = close + 1;
  }
  HSGD_CHECK(names.size() <= kMaxExpanded - hosts.size(), "hostlist '", hostlist,
             "' expands to more than 1000000 hosts");
  for (auto& name : names) hosts.push_back(std::move(name));
}

// An integer variable that must be set.
int64_t required_int(const EnvLookup& lookup, const char* name, int64_t min_value) {
  const char* value = lookup(name);
  HSGD_CHECK(value != nullptr && *value != '\0', "environment variable ", name,
             " is not set, but SLURM_STEP_ID is: srun sets both for every task");
  const auto parsed = parse_uint(value);
  HSGD_CHECK(parsed.has_value(), "environment variable ", name, "='", value,
             "' is not a non-negative integer");
  HSGD_CHECK(*parsed >= min_value, "environment variable ", name, "=", *parsed,
             " must be >= ", min_value);
  return *parsed;
}

std::string required_string(const EnvLookup& lookup, const char* name) {
  const char* value = lookup(name);
  HSGD_CHECK(value != nullptr && *value != '\0', "environment variable ", name,
             " is not set, but SLURM_STEP_ID is: srun sets both for every task");
  return value;
}

}  // namespace

bool SlurmStep::block_layout() const {
  const int before = std::accumulate(tasks_per_node.begin(), tasks_per_node.begin() + node_rank, 0);
  return rank == before + local_rank;
}

bool SlurmStep::uniform_tasks_per_node() const {
  for (int tasks : tasks_per_node) {
    if (tasks != tasks_per_node.front()) return false;
  }
  return true;
}

std::vector<int> expand_tasks_per_node(std::string_view text) {
  const auto fail = [&](std::string_view part) {
    throw InvalidArgument(
        str_cat("tasks per node '", text, "': '", part,
                "' is not a positive count or COUNT(xREPEAT); expected e.g. 4 or 2(x3),1"));
  };
  std::vector<int> counts;
  for (std::string_view item : split_top_level(text)) {
    std::string_view count_text = item;
    int64_t repeat = 1;
    if (const size_t open = item.find("(x"); open != std::string_view::npos) {
      if (item.back() != ')') fail(item);
      const auto parsed = parse_uint(item.substr(open + 2, item.size() - open - 3));
      if (!parsed || *parsed < 1) fail(item);
      repeat = *parsed;
      count_text = item.substr(0, open);
    }
    const auto count = parse_uint(count_text);
    if (!count || *count < 1 || *count > (1 << 20)) fail(item);
    if (static_cast<size_t>(repeat) > kMaxExpanded - counts.size()) {
      throw InvalidArgument(str_cat("tasks per node '", text, "' lists more than 1000000 nodes"));
    }
    counts.insert(counts.end(), static_cast<size_t>(repeat), static_cast<int>(*count));
  }
  return counts;
}

std::vector<std::string> expand_hostlist(std::string_view text) {
  HSGD_CHECK(!text.empty(), "hostlist is empty; expected host names like node[01-03,07]");
  std::vector<std::string> hosts;
  for (std::string_view entry : split_top_level(text)) expand_entry(text, entry, hosts);
  return hosts;
}

int slurm_rendezvous_port(int64_t job_id, int64_t step_id) {
  return static_cast<int>(20000 + 10 * (job_id % 1000) + step_id % 10);
}

std::optional<SlurmStep> slurm_step_from_env(const EnvLookup& lookup) {
  const auto is_set = [&](const char* name) {
    const char* value = lookup(name);
    return value != nullptr && *value != '\0';
  };
  if (!is_set("SLURM_PROCID") || !is_set("SLURM_STEP_ID")) return std::nullopt;

  SlurmStep step;
  step.world_size = static_cast<int>(required_int(lookup, "SLURM_NTASKS", 1));
  step.rank = static_cast<int>(required_int(lookup, "SLURM_PROCID", 0));
  HSGD_CHECK(step.rank < step.world_size, "environment variable SLURM_PROCID=", step.rank,
             " must be < SLURM_NTASKS=", step.world_size);
  step.local_rank = static_cast<int>(required_int(lookup, "SLURM_LOCALID", 0));
  step.node_rank = static_cast<int>(required_int(lookup, "SLURM_NODEID", 0));
  const int64_t num_nodes = required_int(lookup, "SLURM_STEP_NUM_NODES", 1);
  step.job_id = required_int(lookup, "SLURM_JOB_ID", 0);
  step.step_id = required_int(lookup, "SLURM_STEP_ID", 0);

  const std::string tasks_text = required_string(lookup, "SLURM_STEP_TASKS_PER_NODE");
  step.tasks_per_node = expand_tasks_per_node(tasks_text);
  HSGD_CHECK(static_cast<int64_t>(step.tasks_per_node.size()) == num_nodes,
             "environment variable SLURM_STEP_TASKS_PER_NODE='", tasks_text, "' lists ",
             step.tasks_per_node.size(), " nodes but SLURM_STEP_NUM_NODES=", num_nodes);
  const int64_t total =
      std::accumulate(step.tasks_per_node.begin(), step.tasks_per_node.end(), int64_t{0});
  HSGD_CHECK(total == step.world_size, "environment variable SLURM_STEP_TASKS_PER_NODE='",
             tasks_text, "' adds up to ", total, " tasks but SLURM_NTASKS=", step.world_size);

  const std::string nodes_text = required_string(lookup, "SLURM_STEP_NODELIST");
  step.nodes = expand_hostlist(nodes_text);
  HSGD_CHECK(static_cast<int64_t>(step.nodes.size()) == num_nodes,
             "environment variable SLURM_STEP_NODELIST='", nodes_text, "' names ",
             step.nodes.size(), " hosts but SLURM_STEP_NUM_NODES=", num_nodes);

  HSGD_CHECK(step.node_rank < num_nodes, "environment variable SLURM_NODEID=", step.node_rank,
             " must be < SLURM_STEP_NUM_NODES=", num_nodes);
  HSGD_CHECK(step.local_rank < step.local_world_size(),
             "environment variable SLURM_LOCALID=", step.local_rank, " must be < ",
             step.local_world_size(), ", the tasks of node ", step.node_rank,
             " in SLURM_STEP_TASKS_PER_NODE='", tasks_text, "'");
  return step;
}

std::optional<SlurmStep> slurm_step_from_env() {
  return slurm_step_from_env([](const char* name) { return std::getenv(name); });
}

}  // namespace hsgd::comm
