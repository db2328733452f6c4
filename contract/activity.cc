#include "contract/activity.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace substrax {
namespace {

constexpr char kMagic[8] = {'S', 'X', 'A', 'C', 'T', '0', '1', '\0'};

struct Header {
  char magic[8];
  uint32_t device_slots;
  uint32_t group_slots;
};
struct DeviceRecord {
  int64_t device_plus_one;  // 0: unused
  int64_t step;
  int64_t phase;
  int64_t since_ns;
};
struct GroupRecord {
  int64_t used;
  int64_t device_id;
  int64_t rank;
  int64_t size;
  int64_t entered;
  int64_t completed;
  int64_t last_kind;
  int64_t last_count;
  char name[kActivityNameBytes];
};
struct Layout {
  Header header;
  DeviceRecord devices[kActivityDeviceSlots];
  GroupRecord groups[kActivityGroupSlots];
};

void Store(int64_t* field, int64_t value, int order = __ATOMIC_RELAXED) {
  __atomic_store_n(field, value, order);
}
int64_t Load(const int64_t* field) { return __atomic_load_n(field, __ATOMIC_RELAXED); }

Layout* At(void* map) { return static_cast<Layout*>(map); }

std::string Printable(absl::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return out;
}

std::atomic<ActivityBoard*> g_board{nullptr};
thread_local int t_device = -1;

}  // namespace

const char* ActivityPhaseName(ActivityPhase phase) {
  switch (phase) {
    case ActivityPhase::kNone: return "";
    case ActivityPhase::kData: return "data";
    case ActivityPhase::kCompute: return "compute";
    case ActivityPhase::kCollective: return "collective";
    case ActivityPhase::kCheckpoint: return "checkpoint";
    case ActivityPhase::kEvaluation: return "evaluation";
    case ActivityPhase::kReport: return "report";
  }
  return "?";
}

const char* CollectiveKindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kNone: return "";
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kBarrier: return "barrier";
  }
  return "?";
}

size_t ActivityFileBytes() { return sizeof(Layout); }

struct ActivityBoard::Claims {
  std::mutex mu;
  int groups = 0;
};

ActivityBoard::ActivityBoard(void* map, size_t bytes)
    : map_(map), bytes_(bytes), claims_(std::make_unique<Claims>()) {}

ActivityBoard::~ActivityBoard() { munmap(map_, bytes_); }

absl::StatusOr<std::unique_ptr<ActivityBoard>> ActivityBoard::Create(const std::string& path) {
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  auto failed = [&path](const char* what) {
    return absl::Status(absl::ErrnoToStatus(errno, "").code(),
                        absl::StrCat("activity file ", path, ": ", what, ": ",
                                     std::strerror(errno)));
  };
  if (fd < 0) return failed("open");
  if (ftruncate(fd, static_cast<off_t>(sizeof(Layout))) != 0) {
    absl::Status s = failed("ftruncate");
    close(fd);
    return s;
  }
  void* map = mmap(nullptr, sizeof(Layout), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  absl::Status mapped = map == MAP_FAILED ? failed("mmap") : absl::OkStatus();
  close(fd);
  if (!mapped.ok()) return mapped;
  Layout* layout = At(map);
  layout->header.device_slots = kActivityDeviceSlots;
  layout->header.group_slots = kActivityGroupSlots;
  std::memcpy(layout->header.magic, kMagic, sizeof(kMagic));
  return std::unique_ptr<ActivityBoard>(new ActivityBoard(map, sizeof(Layout)));
}

int ActivityBoard::DeviceSlot(int device_id) {
  std::lock_guard<std::mutex> lock(claims_->mu);
  Layout* layout = At(map_);
  for (int i = 0; i < kActivityDeviceSlots; ++i) {
    DeviceRecord& r = layout->devices[i];
    if (Load(&r.device_plus_one) == device_id + 1) return i;
    if (Load(&r.device_plus_one) == 0) {
      Store(&r.device_plus_one, device_id + 1, __ATOMIC_RELEASE);
      return i;
    }
  }
  return -1;
}

void ActivityBoard::SetPhase(int slot, ActivityPhase phase, int64_t step) {
  if (slot < 0 || slot >= kActivityDeviceSlots) return;
  DeviceRecord& r = At(map_)->devices[slot];
  Store(&r.step, step);
  Store(&r.since_ns, absl::GetCurrentTimeNanos());
  Store(&r.phase, static_cast<int64_t>(phase));
}

int ActivityBoard::GroupSlot(const std::string& name, int device_id, int rank, int size) {
  std::lock_guard<std::mutex> lock(claims_->mu);
  if (claims_->groups >= kActivityGroupSlots) return -1;
  const int slot = claims_->groups++;
  GroupRecord& r = At(map_)->groups[slot];
  std::memset(r.name, 0, sizeof(r.name));
  std::memcpy(r.name, name.data(), std::min(name.size(), sizeof(r.name) - 1));
  Store(&r.device_id, device_id);
  Store(&r.rank, rank);
  Store(&r.size, size);
  Store(&r.used, 1, __ATOMIC_RELEASE);
  return slot;
}

void ActivityBoard::Enter(int slot, CollectiveKind kind, int64_t count) {
  if (slot < 0 || slot >= kActivityGroupSlots) return;
  GroupRecord& r = At(map_)->groups[slot];
  Store(&r.last_kind, static_cast<int64_t>(kind));
  Store(&r.last_count, count);
  Store(&r.entered, Load(&r.entered) + 1);
}

void ActivityBoard::Complete(int slot) {
  if (slot < 0 || slot >= kActivityGroupSlots) return;
  GroupRecord& r = At(map_)->groups[slot];
  Store(&r.completed, Load(&r.completed) + 1);
}

absl::StatusOr<v1::ProcessActivity> ReadActivityFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    return absl::Status(absl::ErrnoToStatus(errno, "").code(),
                        absl::StrCat("activity file ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  std::vector<char> bytes(sizeof(Layout));
  const bool regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                       static_cast<size_t>(st.st_size) == sizeof(Layout);
  const ssize_t n = regular ? pread(fd, bytes.data(), bytes.size(), 0) : -1;
  close(fd);
  if (n != static_cast<ssize_t>(bytes.size()) ||
      std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(absl::StrCat("activity file ", path,
                                            ": not an activity file of this release"));
  }
  Layout layout;
  std::memcpy(&layout, bytes.data(), sizeof(layout));
  v1::ProcessActivity out;
  for (const DeviceRecord& r : layout.devices) {
    if (r.device_plus_one <= 0) continue;
    v1::DeviceActivity* d = out.add_devices();
    d->set_device_id(static_cast<int32_t>(r.device_plus_one - 1));
    d->set_step(r.step);
    const int64_t phase = r.phase;
    d->set_phase(phase >= 0 && phase <= static_cast<int64_t>(ActivityPhase::kReport)
                     ? ActivityPhaseName(static_cast<ActivityPhase>(phase))
                     : "?");
    if (r.since_ns > 0) {
      d->mutable_since()->set_seconds(r.since_ns / 1000000000);
      d->mutable_since()->set_nanos(static_cast<int32_t>(r.since_ns % 1000000000));
    }
  }
  for (const GroupRecord& r : layout.groups) {
    if (r.used != 1) continue;
    v1::CollectiveCounter* c = out.add_collectives();
    c->set_group(Printable(absl::string_view(r.name, strnlen(r.name, sizeof(r.name)))));
    c->set_device_id(static_cast<int32_t>(r.device_id));
    c->set_rank(static_cast<int32_t>(r.rank));
    c->set_size(static_cast<int32_t>(r.size));
    c->set_entered(r.entered);
    c->set_completed(r.completed);
    const int64_t kind = r.last_kind;
    c->set_last_kind(kind >= 0 && kind <= static_cast<int64_t>(CollectiveKind::kBarrier)
                         ? CollectiveKindName(static_cast<CollectiveKind>(kind))
                         : "?");
    c->set_last_count(r.last_count);
  }
  return out;
}

ActivityBoard* ProcessActivityBoard() { return g_board.load(std::memory_order_acquire); }

void InstallProcessActivityBoard(std::unique_ptr<ActivityBoard> board) {
  // Never freed: threads may hold the pointer until the process exits.
  g_board.store(board.release(), std::memory_order_release);
}

int ThreadActivityDevice() { return t_device; }
void SetThreadActivityDevice(int device_id) { t_device = device_id; }

}  // namespace substrax
