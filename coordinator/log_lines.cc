#include "coordinator/log_lines.h"

#include <algorithm>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace substrax {

std::string ValidUtf8(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    size_t len = 0;
    uint32_t min = 0;
    if (c < 0x80) {
      len = 1;
    } else if ((c & 0xe0) == 0xc0) {
      len = 2;
      min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      min = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      min = 0x10000;
    }
    bool ok = len > 0 && i + len <= n;
    uint32_t code = len == 1 ? c : (c & (0xff >> (len + 1)));
    for (size_t k = 1; ok && k < len; ++k) {
      ok = (s[i + k] & 0xc0) == 0x80;
      code = (code << 6) | (s[i + k] & 0x3f);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8 either.
    if (ok && len > 1) ok = code >= min && code <= 0x10ffff && (code < 0xd800 || code > 0xdfff);
    if (ok) {
      out.append(text, i, len);
      i += len;
    } else {
      out.append("\xef\xbf\xbd");
      ++i;
    }
  }
  return out;
}

int64_t LogAssembler::Add(const LogChunk& chunk, std::vector<std::string>* lines) {
  const int64_t end = chunk.offset + static_cast<int64_t>(chunk.data.size());
  int64_t dropped = 0;
  size_t skip = 0;
  if (chunk.offset > next_) {
    // Retention deleted the bytes in between; the line they were part of is incomplete.
    dropped = chunk.offset - next_;
    partial_.clear();
  } else {
    skip = static_cast<size_t>(std::min(next_, end) - chunk.offset);
  }
  next_ = std::max(next_, end);
  size_t start = skip;
  const std::string& data = chunk.data;
  while (start < data.size()) {
    const size_t newline = data.find('\n', start);
    if (newline == std::string::npos) {
      partial_.append(data, start, std::string::npos);
      break;
    }
    partial_.append(data, start, newline - start);
    lines->push_back(ValidUtf8(partial_));
    partial_.clear();
    start = newline + 1;
  }
  // A line without an end in sight is shown in pieces, so that memory stays bounded.
  while (partial_.size() >= kMaxLogLineBytes) {
    lines->push_back(ValidUtf8(partial_.substr(0, kMaxLogLineBytes)));
    partial_.erase(0, kMaxLogLineBytes);
  }
  if (chunk.eof) {
    eof_ = true;
    if (!partial_.empty()) lines->push_back(ValidUtf8(partial_));
    partial_.clear();
  }
  return dropped;
}

LogReader::LogReader(StateStore* store, std::string job_id, int attempt, int process_index,
                     int tail_lines)
    : store_(store),
      job_id_(std::move(job_id)),
      attempt_(attempt),
      process_index_(process_index),
      tail_lines_(tail_lines) {}

namespace {

std::string DroppedNotice(int process, const std::string& host, int64_t bytes) {
  return absl::StrCat("process ", process, " (host ", host, "): [... ", bytes,
                      " earlier bytes dropped ...] (the coordinator keeps the newest "
                      "--log-max-bytes-per-process bytes of each process)");
}

}  // namespace

absl::StatusOr<bool> LogReader::Read(std::vector<v1::ReadLogsResponse>* out, int64_t page_bytes) {
  SUBSTRAX_ASSIGN_OR_RETURN(std::vector<LogExtent> extents,
                            store_->LogExtents(job_id_, attempt_));
  v1::ReadLogsResponse current;
  int64_t current_bytes = 0;
  auto flush = [&] {
    if (current.lines_size() > 0 || current.notices_size() > 0) out->push_back(std::move(current));
    current.Clear();
    current_bytes = 0;
  };
  auto add_lines = [&](int p, const std::string& host, const std::vector<std::string>& lines) {
    for (const std::string& text : lines) {
      v1::LogLine* line = current.add_lines();
      line->set_attempt(attempt_);
      line->set_process_index(p);
      line->set_host(host);
      line->set_text(text);
      current_bytes += static_cast<int64_t>(text.size() + host.size()) + 16;
      if (current_bytes >= page_bytes) flush();
    }
  };
  bool more = false;
  for (const LogExtent& extent : extents) {
    const int p = extent.process_index;
    if (process_index_ >= 0 && p != process_index_) continue;
    auto [it, first] = logs_.try_emplace(p);
    Log& log = it->second;
    log.host = ValidUtf8(extent.host);
    LogAssembler& assembler = log.assembler;
    if (assembler.eof()) continue;
    if (first && tail_lines_ > 0) {
      // Every stored line of the process passes, the last tail_lines_ stay.
      std::deque<std::string> tail;
      int64_t dropped = 0;
      while (true) {
        SUBSTRAX_ASSIGN_OR_RETURN(
            std::vector<LogChunk> chunks,
            store_->ReadLogChunks(job_id_, attempt_, p, assembler.next(), page_bytes));
        for (const LogChunk& chunk : chunks) {
          std::vector<std::string> lines;
          dropped += assembler.Add(chunk, &lines);
          for (std::string& line : lines) {
            tail.push_back(std::move(line));
            if (static_cast<int>(tail.size()) > tail_lines_) tail.pop_front();
          }
        }
        if (chunks.empty() || assembler.eof() || assembler.next() >= extent.end) break;
      }
      // Dropped bytes matter only when the tail reaches back to them.
      if (dropped > 0 && static_cast<int>(tail.size()) < tail_lines_) {
        current.add_notices(DroppedNotice(p, log.host, dropped));
      }
      add_lines(p, log.host, std::vector<std::string>(tail.begin(), tail.end()));
      continue;
    }
    if (assembler.next() >= extent.end && !extent.eof) continue;
    SUBSTRAX_ASSIGN_OR_RETURN(
        std::vector<LogChunk> chunks,
        store_->ReadLogChunks(job_id_, attempt_, p, assembler.next(), page_bytes));
    for (const LogChunk& chunk : chunks) {
      std::vector<std::string> lines;
      const int64_t dropped = assembler.Add(chunk, &lines);
      if (dropped > 0) current.add_notices(DroppedNotice(p, log.host, dropped));
      add_lines(p, log.host, lines);
    }
    if (!chunks.empty() && !assembler.eof() && assembler.next() < extent.end) more = true;
  }
  flush();
  return more;
}

int LogReader::complete() const {
  int n = 0;
  for (const auto& [p, log] : logs_) n += log.assembler.eof() ? 1 : 0;
  return n;
}

std::vector<std::string> LogReader::Incomplete(int processes, absl::Duration grace) const {
  std::vector<std::string> notices;
  for (int p = 0; p < processes; ++p) {
    if (process_index_ >= 0 && p != process_index_) continue;
    auto it = logs_.find(p);
    if (it != logs_.end() && it->second.assembler.eof()) continue;
    const std::string who =
        it == logs_.end() ? absl::StrCat("process ", p)
                          : absl::StrCat("process ", p, " (host ", it->second.host, ")");
    notices.push_back(absl::StrCat(
        who, ": the log may be incomplete: its worker shipped no end of it within ",
        absl::FormatDuration(grace),
        " of the attempt's end (its daemon may have died or lost the coordinator)"));
  }
  return notices;
}

}  // namespace substrax
