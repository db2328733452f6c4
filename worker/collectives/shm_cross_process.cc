// ShmCommunicator's cross-process mode: the ranks share one POSIX shared-memory segment.
//
// Layout: a header (sizes, the abort word), one 64-byte line of
// counters per rank, then one staging slot per rank (page-aligned). Only rank r writes its line
// and its slot; everyone reads them. A slot is used as a ring of regions of chunk_bytes each.
//
// A collective is cut into chunks (a chunk's values fit one region); chunks are numbered across
// the communicator's life, the same on every rank. Each chunk passes three stages on every rank,
// each ending with a release-store of the rank's counter for it (chunk number + 1):
//   copy    the rank's input for the chunk into its region (`copied`); for all-reduce and
//           reduce-scatter only the parts the peers reduce: its own part r it reads from its
//           input directly, which spares a copy of 1/size of the bytes;
//   reduce  after every rank's copy: part r of the chunk (all-reduce, reduce-scatter) summed in
//           rank order over the peers' regions and its own input, tile by tile into its own
//           region (where its part r was not copied) and from there, still in L1, into its
//           output (`reduced`);
//   gather  after every rank's reduce: the other parts (all-reduce), blocks (all-gather) or the
//           root's values (broadcast) copied out of the peers' regions (`done`).
// A region is written again only after every rank's `done` has passed the chunk it held. Each
// rank runs whichever stage can go on (reduce first: peers wait on it, then copy, then gather),
// so that copying in the next chunks overlaps the peers' reductions: no barrier per chunk.
//
// The copies the peers read (the copy stage's regions, an all-reduce's reduced parts) are written
// with ordinary or streaming stores (ShmWrites; shm_write_tuner.h): streaming stores are weakly
// ordered, so a stage that used them fences before publishing its counter.
//
// Failures: a rank that gives up (timeout, a peer that left or died) writes the abort word; the
// others see it in their next slow check and fail too. The segment stays mapped until each
// rank's communicator is destroyed, so a peer still reading a failed rank's slot reads valid
// memory.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <emmintrin.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "worker/collectives/shm_communicator_internal.h"
#include "worker/collectives/shm_reduce.h"
#include "worker/collectives/shm_write_tuner.h"

namespace substrax::shm {
namespace {

constexpr char kSegmentKey[] = "shm_communicator/segment";
constexpr uint64_t kMagic = 0x5355425354524158;  // "SUBSTRAX"
// At least kMinRegions regions per slot, so that copying in runs ahead of the peers; at most
// kMaxRegions, so that the ring a rank cycles through (512 KiB) stays in cache: cycling through
// all of a 4 MiB slot made a 1 MiB all-reduce 1.7x slower (8 MiB of slots against a 512 KiB L2).
// Chunks of kMaxChunkBytes (at most): 32 KiB measured faster than 64 and 128 KiB at 1 MiB (more
// overlap between the stages; each chunk's synchronization is a few atomics).
constexpr size_t kMinRegions = 4;
constexpr size_t kMaxRegions = 16;
constexpr size_t kMaxChunkBytes = 32 << 10;
constexpr size_t kGranule = 16;
// A reduced tile is copied from the region to the output while it is still in L1.
constexpr size_t kReduceTileBytes = 8 << 10;
constexpr size_t kPage = 4096;

static_assert(std::atomic<uint64_t>::is_always_lock_free, "segment atomics must be lock-free");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "segment atomics must be lock-free");

struct SegmentHeader {
  uint64_t magic = 0;
  uint64_t size = 0;
  uint64_t slot_bytes = 0;
  uint64_t total_bytes = 0;
  alignas(64) std::atomic<uint64_t> abort{0};
  // ShmWrites::kAuto: whether the ranks stream, as rank 0's tuner decided.
  alignas(64) std::atomic<uint32_t> streaming{0};
};

struct alignas(64) SegmentRank {
  std::atomic<uint64_t> copied{0};
  std::atomic<uint64_t> reduced{0};
  std::atomic<uint64_t> done{0};
  std::atomic<uint32_t> attached{0};
  std::atomic<uint32_t> left{0};
};

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// std::memcpy, but with non-temporal stores for the whole 16-byte units of `dst` (SSE2: every
// x86-64 CPU has it).
void StreamingCopy(char* dst, const char* src, size_t bytes) {
  const size_t head = std::min(bytes, (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, head);
  size_t at = head;
  for (; at + 64 <= bytes; at += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + at));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + at + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + at + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + at + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + at), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + at + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + at + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + at + 48), d);
  }
  for (; at + 16 <= bytes; at += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + at),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + at)));
  }
  std::memcpy(dst + at, src + at, bytes - at);
}

size_t RanksOffset() { return RoundUp(sizeof(SegmentHeader), 64); }
size_t SlotsOffset(int size) { return RoundUp(RanksOffset() + size * sizeof(SegmentRank), kPage); }
size_t SlotStride(size_t slot_bytes) { return RoundUp(slot_bytes, kPage); }
size_t TotalBytes(int size, size_t slot_bytes) {
  return SlotsOffset(size) + size * SlotStride(slot_bytes);
}

// A mapping of the segment, unmapped on destruction.
class Mapping {
 public:
  Mapping(char* base, size_t bytes, int size, size_t slot_bytes)
      : base_(base), bytes_(bytes), size_(size), slot_bytes_(slot_bytes) {}
  ~Mapping() { munmap(base_, bytes_); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  SegmentHeader& header() const { return *reinterpret_cast<SegmentHeader*>(base_); }
  SegmentRank& rank(int r) const {
    return reinterpret_cast<SegmentRank*>(base_ + RanksOffset())[r];
  }
  char* slot(int r) const { return base_ + SlotsOffset(size_) + r * SlotStride(slot_bytes_); }

 private:
  char* const base_;
  const size_t bytes_;
  const int size_;
  const size_t slot_bytes_;
};

class CrossProcessImpl final : public ShmCommunicator::Impl {
 public:
  CrossProcessImpl(Group group, std::unique_ptr<Mapping> segment)
      : Impl(std::move(group)),
        segment_(std::move(segment)),
        chunk_bytes_(std::min(kMaxChunkBytes,
                              group_.options.slot_bytes / kMinRegions / 64 * 64)),
        regions_(std::min(kMaxRegions, group_.options.slot_bytes / chunk_bytes_)),
        srcs_(group_.size()) {}
  ~CrossProcessImpl() override {
    segment_->rank(group_.rank).left.store(1, std::memory_order_release);
  }

  bool in_process() const override { return false; }

 protected:
  absl::Status Run(const Collective& c) override;

 private:
  enum class Stage { kCopy, kReduce, kGather };
  using Counter = std::atomic<uint64_t> SegmentRank::*;

  // Chunk k of the collective: its values [begin, begin + len) of each rank's `count`.
  struct Chunk {
    size_t begin = 0;
    size_t len = 0;
  };
  Chunk ChunkOf(const Collective& c, size_t k) const {
    Chunk chunk;
    chunk.begin = std::min(c.count, k * per_chunk_);
    chunk.len = std::min(per_chunk_, c.count - chunk.begin);
    return chunk;
  }
  char* Region(int r, uint64_t chunk) const {
    return segment_->slot(r) + (chunk % regions_) * chunk_bytes_;
  }
  bool AllAtLeast(Counter counter, uint64_t value) const {
    for (int r = 0; r < group_.size(); ++r) {
      if ((segment_->rank(r).*counter).load(std::memory_order_acquire) < value) return false;
    }
    return true;
  }
  void Publish(Counter counter, uint64_t value) {
    // The stage's streaming stores are visible before the counter that says they are done.
    if (streaming_) _mm_sfence();
    (segment_->rank(group_.rank).*counter).store(value, std::memory_order_release);
  }
  // A copy the peers read, with the call's kind of stores.
  void CopyForPeers(char* dst, const char* src, size_t bytes) const {
    if (streaming_) {
      StreamingCopy(dst, src, bytes);
    } else {
      std::memcpy(dst, src, bytes);
    }
  }

  void CopyIn(const Collective& c, uint64_t chunk, const Chunk& part);
  void Reduce(const Collective& c, uint64_t chunk, const Chunk& part);
  void Gather(const Collective& c, uint64_t chunk, const Chunk& part);
  // Why this rank cannot go on, if it cannot: a peer failed first, left or died, or time is up.
  absl::Status Check(const char* op, absl::Time deadline) const;

  const std::unique_ptr<Mapping> segment_;
  const size_t chunk_bytes_;
  const size_t regions_;
  // Chunks run so far (the number of the next one), and values per chunk of the current call.
  uint64_t chunks_ = 0;
  size_t per_chunk_ = 0;
  std::vector<const void*> srcs_;
  // Whether the current call streams, and (kAuto) the schedule of trials.
  bool streaming_ = false;
  WriteTuner tuner_;
  // A reduced tile, before it is copied out (streaming: the staging region is not read back).
  std::vector<double> tile_ = std::vector<double>(kReduceTileBytes / sizeof(double));
};

absl::Status CrossProcessImpl::Run(const Collective& c) {
  if (uint64_t word = segment_->header().abort.load(std::memory_order_acquire); word != 0) {
    return Unusable(group_, c.name, word);
  }
  const int n = group_.size();
  const size_t es = DataTypeSize(c.type);
  per_chunk_ = chunk_bytes_ / es;
  if (c.kind == Kind::kReduceScatter) {
    // A region holds this chunk's values for every destination rank.
    per_chunk_ /= n;
    if (per_chunk_ > kGranule) per_chunk_ = per_chunk_ / kGranule * kGranule;
  }
  const uint64_t chunks = c.count == 0 ? 1 : (c.count + per_chunk_ - 1) / per_chunk_;
  const uint64_t base = chunks_;
  chunks_ += chunks;
  const absl::Time deadline = absl::Now() + group_.options.timeout;
  // For the tuner: from when every rank has copied in its first chunk (all have arrived), so
  // that a peer's late arrival does not count as the call's cost.
  absl::Time all_arrived = absl::InfiniteFuture();
  const size_t bytes = c.count * es;
  std::atomic<uint32_t>& in_force = segment_->header().streaming;
  const bool streaming = in_force.load(std::memory_order_relaxed) != 0;
  switch (group_.options.writes) {
    case ShmWrites::kCached:
      streaming_ = false;
      break;
    case ShmWrites::kStreaming:
      streaming_ = true;
      break;
    case ShmWrites::kAuto:
      streaming_ = tuner_.Streams(bytes, streaming);
      break;
  }
  uint64_t copied = 0, reduced = 0, gathered = 0;  // chunks of this call past each stage
  Backoff backoff;
  while (gathered < chunks) {
    if (reduced < copied && AllAtLeast(&SegmentRank::copied, base + reduced + 1)) {
      if (reduced == 0) all_arrived = absl::Now();
      Reduce(c, base + reduced, ChunkOf(c, reduced));
      Publish(&SegmentRank::reduced, base + ++reduced);
    } else if (copied < chunks &&
               (base + copied < regions_ ||
                AllAtLeast(&SegmentRank::done, base + copied + 1 - regions_))) {
      CopyIn(c, base + copied, ChunkOf(c, copied));
      Publish(&SegmentRank::copied, base + ++copied);
    } else if (gathered < reduced && AllAtLeast(&SegmentRank::reduced, base + gathered + 1)) {
      Gather(c, base + gathered, ChunkOf(c, gathered));
      Publish(&SegmentRank::done, base + ++gathered);
    } else {
      if (backoff.Pause()) {
        absl::Status status = Check(c.name, deadline);
        if (!status.ok()) {
          uint64_t none = 0;
          segment_->header().abort.compare_exchange_strong(
              none, EncodeAbort(group_.rank, status.code()), std::memory_order_acq_rel);
          return status;
        }
      }
      continue;
    }
    backoff.Reset();
  }
  if (group_.options.writes == ShmWrites::kAuto && all_arrived != absl::InfiniteFuture()) {
    const bool next = tuner_.Record(bytes, streaming_, streaming, absl::Now() - all_arrived);
    if (group_.rank == 0 && next != streaming) in_force.store(next, std::memory_order_relaxed);
  }
  return absl::OkStatus();
}

void CrossProcessImpl::CopyIn(const Collective& c, uint64_t chunk, const Chunk& part) {
  const size_t es = DataTypeSize(c.type);
  const char* input = static_cast<const char*>(c.input);
  char* region = Region(group_.rank, chunk);
  switch (c.kind) {
    case Kind::kAllReduce:
      for (int r = 0; r < group_.size(); ++r) {
        if (r == group_.rank) continue;
        const Range theirs = BlockOf(part.len, group_.size(), r, kGranule);
        CopyForPeers(region + theirs.begin * es, input + (part.begin + theirs.begin) * es,
                     theirs.size() * es);
      }
      break;
    case Kind::kAllGather:
      CopyForPeers(region, input + part.begin * es, part.len * es);
      break;
    case Kind::kBroadcast:
      if (group_.rank == c.root) CopyForPeers(region, input + part.begin * es, part.len * es);
      break;
    case Kind::kReduceScatter:
      for (int r = 0; r < group_.size(); ++r) {
        if (r == group_.rank) continue;
        CopyForPeers(region + r * part.len * es, input + (r * c.count + part.begin) * es,
                     part.len * es);
      }
      break;
    case Kind::kBarrier:
      break;
  }
}

void CrossProcessImpl::Reduce(const Collective& c, uint64_t chunk, const Chunk& part) {
  const int n = group_.size(), me = group_.rank;
  const size_t es = DataTypeSize(c.type);
  const char* input = static_cast<const char*>(c.input);
  char* output = static_cast<char*>(c.output);
  // Where part `me` is in the regions, in this rank's input and in its output.
  size_t in_region = 0, in_input = 0, in_output = 0, len = 0;
  if (c.kind == Kind::kAllReduce) {
    const Range mine = BlockOf(part.len, n, me, kGranule);
    in_region = mine.begin * es;
    in_input = in_output = (part.begin + mine.begin) * es;
    len = mine.size();
  } else if (c.kind == Kind::kReduceScatter) {
    in_region = me * part.len * es;
    in_input = (me * c.count + part.begin) * es;
    in_output = part.begin * es;
    len = part.len;
  }
  // Tile by tile: the input tile is read before the same bytes of the output (the same memory
  // for all-reduce) are written.
  const size_t tile = kReduceTileBytes / es;
  char* staging = Region(me, chunk) + in_region;
  for (size_t at = 0; at < len; at += tile) {
    const size_t n_at = std::min(tile, len - at);
    for (int r = 0; r < n; ++r) {
      srcs_[r] = r == me ? input + in_input + at * es : Region(r, chunk) + in_region + at * es;
    }
    // Streaming, the sum goes to a private tile first (streamed, the staging region is not read
    // back from cache), and from there into the staging region only where peers read it (an
    // all-reduce's).
    char* sum = streaming_ ? reinterpret_cast<char*>(tile_.data()) : staging + at * es;
    ReduceInOrder(c.type, c.op, srcs_.data(), n, sum, n_at);
    if (streaming_ && c.kind == Kind::kAllReduce) StreamingCopy(staging + at * es, sum, n_at * es);
    std::memcpy(output + in_output + at * es, sum, n_at * es);
  }
}

void CrossProcessImpl::Gather(const Collective& c, uint64_t chunk, const Chunk& part) {
  const int n = group_.size(), me = group_.rank;
  const size_t es = DataTypeSize(c.type);
  char* output = static_cast<char*>(c.output);
  switch (c.kind) {
    case Kind::kAllReduce:
      for (int r = 0; r < n; ++r) {
        if (r == me) continue;
        const Range theirs = BlockOf(part.len, n, r, kGranule);
        std::memcpy(output + (part.begin + theirs.begin) * es, Region(r, chunk) + theirs.begin * es,
                    theirs.size() * es);
      }
      break;
    case Kind::kAllGather:
      for (int r = 0; r < n; ++r) {
        char* dst = output + (r * c.count + part.begin) * es;
        const char* src = r == me ? static_cast<const char*>(c.input) + part.begin * es
                                  : Region(r, chunk);
        if (dst != src) std::memcpy(dst, src, part.len * es);
      }
      break;
    case Kind::kBroadcast:
      if (me != c.root) std::memcpy(output + part.begin * es, Region(c.root, chunk), part.len * es);
      break;
    case Kind::kReduceScatter:
    case Kind::kBarrier:
      break;
  }
}

absl::Status CrossProcessImpl::Check(const char* op, absl::Time deadline) const {
  // Behind this rank in any stage: the ranks it is waiting for.
  const SegmentRank& self = segment_->rank(group_.rank);
  const auto behind = [&](int r) {
    const SegmentRank& peer = segment_->rank(r);
    for (Counter counter : {&SegmentRank::copied, &SegmentRank::reduced, &SegmentRank::done}) {
      if ((peer.*counter).load(std::memory_order_acquire) <
          (self.*counter).load(std::memory_order_relaxed)) {
        return true;
      }
    }
    return false;
  };
  std::vector<int> missing;
  for (int r = 0; r < group_.size(); ++r) {
    if (r != group_.rank && behind(r)) missing.push_back(r);
  }
  if (uint64_t word = segment_->header().abort.load(std::memory_order_acquire); word != 0) {
    int rank = 0;
    absl::StatusCode code;
    DecodeAbort(word, &rank, &code);
    return group_.Aborted(op, code, rank, missing);
  }
  for (int r : missing) {
    // `left` is stored after a rank's last counters: still behind after it, it is gone.
    if (segment_->rank(r).left.load(std::memory_order_acquire) != 0 && behind(r)) {
      return group_.Left(op, r);
    }
  }
  SUBSTRAX_RETURN_IF_ERROR(group_.DeadPeers(op));
  if (absl::Now() >= deadline) return group_.Timeout(op, missing);
  return absl::OkStatus();
}

// Unlinks the segment's name when it goes out of scope (rank 0): whatever happens, nothing is
// left in /dev/shm once every rank has mapped it or connecting failed.
class Unlinker {
 public:
  explicit Unlinker(std::string name) : name_(std::move(name)) {}
  ~Unlinker() {
    if (!name_.empty()) shm_unlink(name_.c_str());
  }

 private:
  const std::string name_;
};

absl::Status Errno(const std::string& who, const std::string& what, const std::string& name) {
  return absl::UnavailableError(
      absl::StrCat(who, ": ", what, " shared-memory segment ", name, ": ", std::strerror(errno)));
}

// Maps the segment `name` (created by rank 0 when `create`), checking its layout.
absl::StatusOr<std::unique_ptr<Mapping>> MapSegment(const Group& group, const std::string& name,
                                                    bool create, const std::string& who) {
  const size_t bytes = TotalBytes(group.size(), group.options.slot_bytes);
  const int fd = shm_open(name.c_str(), create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
  if (fd < 0) return Errno(who, create ? "creating" : "opening", name);
  if (create) {
    // Allocated now, so that a full /dev/shm is an error here rather than a SIGBUS later.
    if (ftruncate(fd, bytes) != 0) {
      absl::Status s = Errno(who, absl::StrCat("sizing (", bytes, " bytes)"), name);
      close(fd);
      return s;
    }
    if (const int error = posix_fallocate(fd, 0, bytes); error != 0) {
      errno = error;
      absl::Status s = Errno(who, absl::StrCat("allocating ", bytes, " bytes of"), name);
      close(fd);
      return s;
    }
  } else {
    struct stat st = {};
    if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
      close(fd);
      return absl::FailedPreconditionError(absl::StrCat(
          who, ": shared-memory segment ", name, " has ", st.st_size, " bytes, not the ", bytes,
          " of ", group.size(), " ranks with slot_bytes ", group.options.slot_bytes,
          ": the ranks disagree on the group or its options"));
    }
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return Errno(who, "mapping", name);
  auto mapping = std::make_unique<Mapping>(static_cast<char*>(base), bytes, group.size(),
                                           group.options.slot_bytes);
  if (create) {
    SegmentHeader* header = new (base) SegmentHeader();
    header->size = group.size();
    header->slot_bytes = group.options.slot_bytes;
    header->total_bytes = bytes;
    for (int r = 0; r < group.size(); ++r) new (&mapping->rank(r)) SegmentRank();
    header->magic = kMagic;  // the name reaches the others through the store after this
  } else if (mapping->header().magic != kMagic ||
             mapping->header().size != static_cast<uint64_t>(group.size()) ||
             mapping->header().slot_bytes != group.options.slot_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": shared-memory segment ", name,
                     " is not a segment of this group (its header differs)"));
  }
  return mapping;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmCommunicator::Impl>> ConnectCrossProcess(Group group,
                                                                           Store* store) {
  const std::string who = group.Connecting("cross-process");
  if (group.options.slot_bytes < 4096 || group.options.slot_bytes < 256 * group.ranks.size() ||
      group.options.slot_bytes % 64 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": slot_bytes ", group.options.slot_bytes,
        " must be a multiple of 64 of at least 4096 and 256 per rank"));
  }
  std::string name;
  std::unique_ptr<Unlinker> unlinker;
  std::unique_ptr<Mapping> segment;
  if (group.rank == 0) {
    name = absl::StrCat("/substrax-", getpid(), "-", RandomId());
    SUBSTRAX_ASSIGN_OR_RETURN(segment, MapSegment(group, name, /*create=*/true, who));
    unlinker = std::make_unique<Unlinker>(name);
    SUBSTRAX_RETURN_IF_ERROR(Annotate(store->Set(kSegmentKey, name), who));
  } else {
    absl::StatusOr<std::string> value = store->Get(kSegmentKey, group.options.connect_timeout);
    if (!value.ok()) return Annotate(value.status(), absl::StrCat(who, ": waiting for rank 0"));
    name = *value;
    SUBSTRAX_ASSIGN_OR_RETURN(segment, MapSegment(group, name, /*create=*/false, who));
  }
  segment->rank(group.rank).attached.store(1, std::memory_order_release);
  SUBSTRAX_RETURN_IF_ERROR(AwaitAllAttached(group, who, [&](int r) {
    return segment->rank(r).attached.load(std::memory_order_acquire) != 0;
  }));
  return std::unique_ptr<ShmCommunicator::Impl>(
      new CrossProcessImpl(std::move(group), std::move(segment)));
}

}  // namespace substrax::shm
