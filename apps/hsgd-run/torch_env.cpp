#include "apps/hsgd-run/torch_env.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <string>
#include <thread>

namespace hsgd::run {
namespace {

const char* pet(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

[[noreturn]] void bad(const char* name, const std::string& value, const std::string& expected) {
  throw UsageError(std::string(name) + "='" + value + "': expected " + expected);
}

// A whole number in [least, most], or UsageError naming the variable.
int to_int(const char* name, const std::string& text, int least, int most) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < least ||
      value > most) {
    bad(name, text, "a whole number from " + std::to_string(least) + " to " + std::to_string(most));
  }
  return value;
}

std::string this_host() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

}  // namespace

void apply_torch_env(Flags& f, TorchEnvGiven& given) {
  if (const char* backend = pet("PET_RDZV_BACKEND")) {
    const std::string b = backend;
    if (b != "static" && b != "c10d") {
      bad("PET_RDZV_BACKEND", b,
          "static or c10d (hsgd-run meets its peers through its own rendezvous server)");
    }
  }
  if (!given.nnodes) {
    if (const char* v = pet("PET_NNODES")) {
      set_nnodes(f, v, std::string("PET_NNODES='") + v + "'");
      given.nnodes = true;
    }
  }
  if (!given.nproc_per_node) {
    if (const char* v = pet("PET_NPROC_PER_NODE")) {
      const std::string text = v;
      if (text == "auto" || text == "cpu") {
        f.nproc_per_node = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      } else if (text == "gpu") {
        bad("PET_NPROC_PER_NODE", text, "a number, 'auto' or 'cpu' (hsgd runs on CPUs)");
      } else {
        f.nproc_per_node = to_int("PET_NPROC_PER_NODE", text, 1, 1 << 16);
      }
      given.nproc_per_node = true;
    }
  }
  if (!given.node_rank) {
    if (const char* v = pet("PET_NODE_RANK")) {
      f.node_rank = to_int("PET_NODE_RANK", v, 0, 1 << 20);
      given.node_rank = true;
    }
  }
  if (!given.rdzv_id) {
    if (const char* v = pet("PET_RDZV_ID")) {
      f.rdzv_id = v;
      given.rdzv_id = true;
    }
  }
  if (given.endpoint) return;
  std::string endpoint;
  if (const char* v = pet("PET_RDZV_ENDPOINT")) {
    endpoint = v;
  } else if (const char* addr = pet("PET_MASTER_ADDR")) {
    const char* port = pet("PET_MASTER_PORT");
    endpoint = std::string(addr) + ":" +
               std::to_string(port != nullptr ? to_int("PET_MASTER_PORT", port, 1, 65535) : 29500);
  }
  if (endpoint.empty()) return;
  f.endpoint = endpoint;
  given.endpoint = true;
  const Endpoint at = parse_endpoint(endpoint, pet("PET_RDZV_ENDPOINT") != nullptr
                                                   ? "PET_RDZV_ENDPOINT"
                                                   : "PET_MASTER_ADDR:PET_MASTER_PORT");
  const std::string host = this_host();
  f.host_server =
      f.node_rank == 0 ||
      (f.node_rank < 0 && !host.empty() &&
       (at.host == host || host.rfind(at.host + ".", 0) == 0 || at.host.rfind(host + ".", 0) == 0));
}

}  // namespace hsgd::run
