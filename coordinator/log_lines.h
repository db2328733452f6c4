// How stored log chunks (a process's stdout and stderr as bytes, at offsets) become the lines
// that ReadLogs streams: LogAssembler joins one process's chunks into whole lines, and LogReader
// reads one attempt's logs from the store, page by page, for a one-off read or a follow.
//
// Lines are whole: a last line without its newline is held until more bytes or the process's
// end. A line longer than kMaxLogLineBytes is cut into pieces of that size. Bytes that are not
// UTF-8 become U+FFFD (lines travel as proto strings).
//
// Not thread-safe: one per stream.
#ifndef SUBSTRAX_COORDINATOR_LOG_LINES_H_
#define SUBSTRAX_COORDINATOR_LOG_LINES_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/state_store.h"
#include "substrax/v1/job_service.pb.h"

namespace substrax {

inline constexpr size_t kMaxLogLineBytes = 64 * 1024;

// `text` with every byte sequence that is not UTF-8 replaced by U+FFFD.
std::string ValidUtf8(const std::string& text);

class LogAssembler {
 public:
  // The offset of the first byte not yet added.
  int64_t next() const { return next_; }
  // The chunk with eof was added.
  bool eof() const { return eof_; }
  // Adds the next chunk of the log (chunks come in offset order; one that starts before next()
  // has its known part skipped). Appends the lines it completes to *lines. Returns how many
  // bytes are missing before the chunk (dropped by retention); a line they cut is dropped too.
  int64_t Add(const LogChunk& chunk, std::vector<std::string>* lines);

 private:
  int64_t next_ = 0;
  std::string partial_;
  bool eof_ = false;
};

// Reads the logs of (job, attempt) from `store`: every process, or one.
class LogReader {
 public:
  // `process_index` -1: every process. `tail_lines` 0: every line; else only the last N of
  // each process in the first Read (later ones, when following, bring every new line).
  LogReader(StateStore* store, std::string job_id, int attempt, int process_index,
            int tail_lines);

  // Reads what was stored since the last call, at most about `page_bytes` per process, and
  // appends responses of at most about `page_bytes` each to *out (lines of one process follow
  // each other; processes in index order; a notice where bytes were dropped). Returns whether
  // more is stored than was read (call again at once). Errors: the store's.
  absl::StatusOr<bool> Read(std::vector<v1::ReadLogsResponse>* out,
                            int64_t page_bytes = 1 << 20);

  // The processes whose logs ended (eof), and those seen so far.
  int complete() const;
  int seen() const { return static_cast<int>(logs_.size()); }
  // "process 1 (host b): the log may be incomplete ..." for each process of [0, processes)
  // (or the one process read) whose log has not ended, `grace` after the attempt ended.
  std::vector<std::string> Incomplete(int processes, absl::Duration grace) const;

 private:
  struct Log {
    LogAssembler assembler;
    std::string host;
  };

  StateStore* const store_;
  const std::string job_id_;
  const int attempt_;
  const int process_index_;
  const int tail_lines_;
  std::map<int, Log> logs_;
};

}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_LOG_LINES_H_
