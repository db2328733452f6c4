// The activity file: what a job process's devices and communicators are doing, published where
// its agent reads it without the process's help, so that a process that is blocked in a
// collective, frozen or stopped by a signal is still seen (docs/diagnosis.md).
//
// The job process (the built-in trainer, an SDK program) creates the file at the launch's
// activity_path and maps it shared; every update is a few relaxed atomic stores into the mapping:
// no system call, no lock, no RPC per collective. The agent reads the whole file (pread) with
// each heartbeat and relays it as a v1::ProcessActivity; the coordinator compares the counts of
// a stalled job's ranks to say which rank the others wait for (hang attribution).
//
// Layout (native byte order; both sides run on the same host), ActivityFileBytes() in all:
//   header   8 bytes magic "SXACT01\0", then the slot counts (uint32 devices, uint32 groups)
//   devices  kActivityDeviceSlots x {int64 device_id + 1 (0: unused), step, phase, since_ns}
//   groups   kActivityGroupSlots x {int64 used, device_id, rank, size, entered, completed,
//            last_kind, last_count; char name[64]}
// A torn read (a slot updated while the agent copies it) gives counts one apart at worst: the
// report is a diagnosis, never a decision about the job's data.
#ifndef SUBSTRAX_CONTRACT_ACTIVITY_H_
#define SUBSTRAX_CONTRACT_ACTIVITY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "substrax/v1/job.pb.h"

namespace substrax {

inline constexpr int kActivityDeviceSlots = 64;
inline constexpr int kActivityGroupSlots = 256;
inline constexpr size_t kActivityNameBytes = 64;

// What a device is doing (DeviceActivity.phase).
enum class ActivityPhase : int64_t {
  kNone = 0,
  kData,
  kCompute,
  kCollective,
  kCheckpoint,
  kEvaluation,
  // A command's process: `since` is when its report file last had a line (a step or a
  // heartbeat), `step` its last step (contract/report_file.h).
  kReport,
};
const char* ActivityPhaseName(ActivityPhase phase);

// The kinds of collectives (CollectiveCounter.last_kind).
enum class CollectiveKind : int64_t {
  kNone = 0,
  kAllReduce,
  kAllGather,
  kBroadcast,
  kReduceScatter,
  kBarrier,
};
const char* CollectiveKindName(CollectiveKind kind);

// The writer side: one per job process. Thread-safe: slots are claimed under a lock once, and
// each slot is then written by the one thread that uses it (a device's, a communicator's).
class ActivityBoard {
 public:
  // Creates (or truncates) the file at `path`, 0644 (the agent may run as another user), and
  // maps it. Errors: the path and the system's reason.
  static absl::StatusOr<std::unique_ptr<ActivityBoard>> Create(const std::string& path);
  ~ActivityBoard();
  ActivityBoard(const ActivityBoard&) = delete;
  ActivityBoard& operator=(const ActivityBoard&) = delete;

  // The slot of device `device_id` (claimed on first use); -1 when every slot is taken.
  int DeviceSlot(int device_id);
  // Device slot `slot` entered `phase` with `step` steps completed (now, on the wall clock).
  void SetPhase(int slot, ActivityPhase phase, int64_t step);

  // The slot of a communicator (claimed on each call: call once per communicator); -1 when
  // every slot is taken. `name` is cut to kActivityNameBytes - 1 bytes.
  int GroupSlot(const std::string& name, int device_id, int rank, int size);
  // The communicator of `slot` entered a collective of `kind` over `count` elements; completed
  // its oldest one still open.
  void Enter(int slot, CollectiveKind kind, int64_t count);
  void Complete(int slot);

 private:
  ActivityBoard(void* map, size_t bytes);
  void* map_;
  size_t bytes_;
  struct Claims;
  std::unique_ptr<Claims> claims_;
};

// The activity file at `path` as the agent relays it: regular files of exactly
// ActivityFileBytes() only, never through a symbolic link; names outside printable ASCII are
// replaced. Errors: NOT_FOUND when there is none (the process has not started publishing),
// DATA_LOSS when it is not an activity file, otherwise open's.
absl::StatusOr<v1::ProcessActivity> ReadActivityFile(const std::string& path);

// The file's size.
size_t ActivityFileBytes();

// The process's board, once installed (null: nothing is published; every hook is a no-op).
// Installed once, at start, by the job process; never removed while threads run.
ActivityBoard* ProcessActivityBoard();
void InstallProcessActivityBoard(std::unique_ptr<ActivityBoard> board);

// The device whose thread this is, for the communicators this thread uses first (-1: not a
// device's thread). Set by the step loop on each device's thread.
int ThreadActivityDevice();
void SetThreadActivityDevice(int device_id);

}  // namespace substrax

#endif  // SUBSTRAX_CONTRACT_ACTIVITY_H_
