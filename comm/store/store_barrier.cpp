#include "comm/store/store_barrier.h"

#include "comm/error.h"
#include "comm/format_ranks.h"

namespace hsgd::comm {

std::vector<std::string> store_barrier_keys(const std::string& prefix, int size) {
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) keys.push_back(prefix + std::to_string(r));
  return keys;
}

std::vector<int> store_barrier_missing(Store& store, const std::string& prefix, int size) {
  std::vector<int> missing;
  for (int r = 0; r < size; ++r) {
    if (!store.check({prefix + std::to_string(r)})) missing.push_back(r);
  }
  return missing;
}

void store_barrier(Store& store, const std::string& prefix, int rank, int size, Duration timeout,
                   const StoreBarrierOptions& options) {
  HSGD_CHECK(size >= 1 && rank >= 0 && rank < size, "store_barrier '", prefix, "': rank ", rank,
             " must be in [0, ", size, ")");
  HSGD_CHECK(options.global_ranks.empty() || options.global_ranks.size() == size_t(size),
             "store_barrier '", prefix, "': ", options.global_ranks.size(),
             " global ranks given for ", size, " ranks");
  store.set(prefix + std::to_string(rank), options.value);
  try {
    store.wait(store_barrier_keys(prefix, size), timeout);
  } catch (const Timeout&) {
    const std::vector<int> missing = store_barrier_missing(store, prefix, size);
    std::string global;
    if (!options.global_ranks.empty()) {
      std::vector<int> missing_global;
      for (int r : missing) missing_global.push_back(options.global_ranks[static_cast<size_t>(r)]);
      global = " (global " + detail::format_ranks(missing_global) + ")";
    }
    const std::string what = !options.what.empty() ? options.what
                                                   : str_cat("store barrier '", prefix, "' (rank ",
                                                             rank, " of ", size, ")");
    HSGD_THROW(Timeout, what, ": ranks ", detail::format_ranks(missing), global,
               " did not arrive within ", timeout.count(), " ms");
  }
}

}  // namespace hsgd::comm
