#include "framework/checkpoint/detail/collective_call.h"

#include "comm/format_ranks.h"

namespace hsgd::checkpoint::detail {

void meet_in_call(comm::ProcessGroup& pg, const std::string& call) {
  if (pg.size() == 1) return;
  try {
    pg.named_barrier(call, comm::RunOn::kCaller)->wait(pg.work_timeout());
  } catch (const comm::CollectiveMismatch& e) {
    throw comm::CollectiveMismatch(
        str_cat(call, " was called on ", hsgd::detail::describe_rank_set(e.same_ranks()),
                " only; every rank must call it: ", e.what()),
        e.same_ranks());
  } catch (const hsgd::Timeout& e) {
    throw hsgd::Timeout(str_cat(call, ": not every rank called it (every rank must): ", e.what()));
  } catch (const hsgd::CommError& e) {
    throw hsgd::CommError(
        str_cat(call, ": not every rank called it (every rank must): ", e.what()));
  }
}

}  // namespace hsgd::checkpoint::detail
