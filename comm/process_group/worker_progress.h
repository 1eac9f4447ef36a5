#pragma once
// Progress heartbeat: how hsgd-run tells a hung worker from a busy one, in seconds rather than
// after the collective timeout, and how it knows which step a job reached and resumed from.
//
// hsgd-run creates one small shared-memory file per node with one slot per local rank and
// passes its path in HSGD_PROGRESS_FILE (comm/launcher/hang_detector.h reads it). A worker
// writes only its own slot (LOCAL_RANK):
//   beats                grows at every collective start and end and every report_progress();
//   in_collective        the collectives this process is running now, waiting for peers
//                        included (several groups can each run one);
//   collective_failures  collectives that ended with an error;
//   step                 the last step given to report_progress() (-1: none yet);
//   first_step           the first one (a resumed run first reports the step it resumed from).
// Every field is a 64-bit atomic written with relaxed ordering (each value is read on its own;
// nothing is published through them), so a report costs a few uncontended atomic adds.
// Without HSGD_PROGRESS_FILE (a program started without hsgd-run, or tests that run several
// ranks in one process) every call does nothing but load one pointer.
// The writing side and the file's layout live here, with the collectives that write it; the
// launcher above only reads the layout (detail::ProgressSlot).
//
// Usage:
//   int64_t step = 0;   // or the step a resumed run starts from
//   for (const data::Batch& batch : loader) {
//     // ... forward, backward, optimizer->step() ...
//     comm::report_progress(++step);
//   }

#include <cstddef>
#include <cstdint>

namespace hsgd::comm {

// The training loop completed `step` steps (call after each optimizer step), or, once at start,
// a resumed run starts from `step`.
void report_progress(int64_t step);

// Marks one collective running on the calling thread, from construction to destruction (the
// collective queue holds one around each task). Destroyed during stack unwinding, it counts the
// collective as failed.
class CollectiveProgress {
 public:
  CollectiveProgress();
  ~CollectiveProgress();
  CollectiveProgress(const CollectiveProgress&) = delete;
  CollectiveProgress& operator=(const CollectiveProgress&) = delete;

 private:
  const int exceptions_at_start_;
};

namespace detail {

// The file: a header, then one slot per local rank, each on its own cache line so that workers
// never write the same line.
inline constexpr uint64_t kProgressMagic = 0x6873676470726f67;  // "hsgdprog"

struct alignas(64) ProgressHeader {
  uint64_t magic;
  uint64_t slots;
};

struct alignas(64) ProgressSlot {
  uint64_t beats;
  uint64_t in_collective;
  uint64_t collective_failures;
  int64_t step;
  int64_t first_step;
};

inline constexpr size_t progress_file_size(size_t slots) {
  return sizeof(ProgressHeader) + slots * sizeof(ProgressSlot);
}

}  // namespace detail
}  // namespace hsgd::comm
